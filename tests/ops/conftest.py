"""Fixtures of the migration tests: a cached real torch-npu wheel per release (``npu-migrate ops``)."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT


def releases_dir() -> Path:
    return Path(os.environ.get("NPU_MIGRATE_RELEASES_DIR") or ROOT / ".ci-cache" / "torch-npu-releases")


def this_torch_line() -> str | None:
    """The newest cached release built for the running torch's line (2.7.1.post11 on torch 2.7.1),
    read from the wheels' METADATA, or None where none is cached."""
    import torch
    from packaging.version import Version

    from npu_migrate.releases import pairs, wheels

    cached = [wheels.Release(match.group("version"), path, "cache")
              for path in releases_dir().glob("torch_npu-*.whl") if (match := wheels.WHEEL_NAME.match(path.name))]
    found = pairs.same_line(torch.__version__, sorted(cached, key=lambda r: Version(r.version), reverse=True))
    return found.version if found is not None else None


def registers(release: str, name: str) -> bool:
    """Whether torch-npu ``release`` registers the aten operator ``name`` (its default overload) for
    the NPU: read from the cached wheel as a zip file, its codegen YAML's ``- func: name(...)`` or
    ``- name`` lines, without the package's own reader, so a test's expectation comes from the wheel."""
    (wheel,) = releases_dir().glob(f"torch_npu-{release}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml").decode()
    return re.search(rf"^\s*-\s*(?:func:\s*)?{re.escape(name)}\s*(?:\(|$)", text, re.M) is not None


RELEASES = tuple(dict.fromkeys(("2.14.0", "2.1.0.post17", this_torch_line() or "2.14.0")))
"""The two ends, and the release of the running torch's line where that is another (the torch 2.7.1
tier audits against torch-npu 2.7.1's operators too)."""


EVERY_RELEASE = tuple(re.findall(r"^\[torch-npu ([^]]+)\]", (ROOT / "tests" / "fake_npu" / "NOT_SIMULATED.txt")
                                 .read_text(), re.M))
"""Every release the stand-in follows (the sections of tests/fake_npu/NOT_SIMULATED.txt; CI caches
each): the tests whose expectation depends on what a release registers run against each; those
beyond :data:`RELEASES` are marked slow, so the fast loop keeps its three."""


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A release whose wheel is cached (never downloaded by a test)."""
    return _cached(request.param, monkeypatch)


@pytest.fixture(params=[pytest.param(v, marks=() if v in RELEASES else pytest.mark.slow) for v in EVERY_RELEASE])
def every_release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each release of :data:`EVERY_RELEASE`, cached as for :func:`release`."""
    return _cached(request.param, monkeypatch)


def _cached(version: str, monkeypatch: pytest.MonkeyPatch) -> str:
    directory = releases_dir()
    if not any(directory.glob(f"torch_npu-{version}-*.whl")):
        pytest.skip(f"torch-npu {version} is not cached in {directory}: run `pip download --no-deps "
                    f"-d {directory} torch-npu=={version}` (CI caches it)")
    monkeypatch.setenv("NPU_MIGRATE_RELEASES_DIR", str(directory))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a test never reaches for the index
    return version
