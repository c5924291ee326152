"""npu_migrate.env's report read in-process: what it reports, and that it only reads."""

from __future__ import annotations

import os

import pytest

from npu_migrate import env


def test_collect_with_a_forced_family_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_MIGRATE_DEVICE", "npu")  # the argument wins; npu is never tried
    before = dict(os.environ)
    report = env.collect("cpu")
    assert dict(os.environ) == before
    assert (report["device_type"], report["device_source"], report["device_count"]) == ("cpu", "argument", 1)
    assert report["environment"]["NPU_MIGRATE_DEVICE"] == "npu"  # the variables as the user set them
    monkeypatch.delenv("NPU_MIGRATE_DEVICE")
    env.collect("cpu")
    assert "NPU_MIGRATE_DEVICE" not in os.environ
