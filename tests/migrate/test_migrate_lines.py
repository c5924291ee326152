"""Whole lines under ``npu-migrate run``: the children of an ``mp.spawn`` script never mix their lines."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from conftest import child_env, run_cli

SCRIPTS = Path(__file__).with_name("scripts")


@pytest.mark.slow
def test_spawned_ranks_write_whole_prefixed_lines() -> None:
    result = run_cli("run", "--device-num", "2", str(SCRIPTS / "spawn_lines.py"),
                     env=child_env(PYTHONUNBUFFERED="1"), timeout=240)
    assert result.returncode == 0, result.stderr
    host = re.escape(socket.gethostname())
    line = re.compile(rf"^\[{host} node0 rank(\d)\] ACCEPT-OK rank=(\d) step=(\d+) loss=\d+\.\d{{3}}$")
    seen: dict[int, list[int]] = {0: [], 1: []}
    for text in result.stdout.splitlines():
        match = line.match(text)
        assert match and match.group(1) == match.group(2), f"a mixed or unprefixed line: {text!r}"
        seen[int(match.group(1))].append(int(match.group(3)))
    assert seen == {0: list(range(200)), 1: list(range(200))}
    done = sorted(t for t in result.stderr.splitlines() if " done" in t)
    assert done == [f"[{socket.gethostname()} node0 rank{r}] rank {r} done" for r in (0, 1)]


@pytest.mark.slow
def test_one_spawned_process_gets_no_prefix(tmp_path: Path) -> None:
    result = run_cli("run", "--device-num", "1", str(SCRIPTS / "spawn_lines.py"), env=child_env(PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "ACCEPT-OK rank=0 step=0 loss=2.000"
