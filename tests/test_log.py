"""Every log record carries the rank."""

from __future__ import annotations

import io
import logging

import pytest

from npu_migrate.log import log_rank0, setup_logging


def test_records_carry_rank_and_rank0_only_logs_on_rank0(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    setup_logging(logging.INFO, stream=stream)
    log = logging.getLogger("npu_migrate.test")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    log.info("hello %s", "there")
    log_rank0(log, "only once")
    monkeypatch.setenv("RANK", "0")
    log_rank0(log, "only once")
    assert stream.getvalue().splitlines() == [
        "[rank 1/4] INFO npu_migrate.test: hello there",
        "[rank 0/4] INFO npu_migrate.test: only once",
    ]
    setup_logging(logging.INFO, stream=stream)  # again: replaces, does not duplicate
    ours = [h for h in logging.getLogger("npu_migrate").handlers if h.get_name() == "npu_migrate"]
    assert len(ours) == 1
