"""Fixtures of the migration tests: a cached real torch-npu wheel per release (``npu-migrate ops``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import ROOT

RELEASES = ("2.14.0", "2.1.0.post17")


def releases_dir() -> Path:
    return Path(os.environ.get("NPU_MIGRATE_RELEASES_DIR") or ROOT / ".ci-cache" / "torch-npu-releases")


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A release whose wheel is cached (never downloaded by a test)."""
    directory = releases_dir()
    if not any(directory.glob(f"torch_npu-{request.param}-*.whl")):
        pytest.skip(f"torch-npu {request.param} is not cached in {directory}: run `pip download --no-deps "
                    f"-d {directory} torch-npu=={request.param}` (CI caches it)")
    monkeypatch.setenv("NPU_MIGRATE_RELEASES_DIR", str(directory))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a test never reaches for the index
    return request.param
