"""Run directories (the ranks' FIFOs, error and flight records) left by a killed launcher are removed by the next one."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from support import JOB, Launch, wait_for_files, wait_until


def run_dir(tmp: Path, launch: Launch) -> Path:
    found: list[Path] = []

    def made() -> bool:
        found[:] = [p for p in tmp.glob(f"npu_migrate_launch_{launch.proc.pid}_*") if (p / "launcher.json").exists()]
        return bool(found)

    wait_until(made, f"launcher {launch.name} made its run directory")
    return found[0]


@pytest.mark.slow
def test_a_killed_launchers_run_dir_is_removed_by_the_next_launcher_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"  # the launchers' temporary directory: this test's own
    tmp.mkdir()
    out_a, out_b, out_c = (tmp_path / n for n in "abc")
    for out in (out_a, out_b, out_c):
        out.mkdir()
    release = tmp_path / "release"
    killed = Launch(out_a, "--device-num", "1", str(JOB), "--hold", str(release), name="killed", TMPDIR=str(tmp))
    live = Launch(out_b, "--device-num", "1", str(JOB), "--hold", str(release), name="live", TMPDIR=str(tmp))
    try:
        wait_for_files(out_a, ["rank0.json"])
        wait_for_files(out_b, ["rank0.json"])
        left, kept = run_dir(tmp, killed), run_dir(tmp, live)
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait()
        assert left.is_dir()  # nothing ran that could remove it
        nxt = Launch(out_c, "--device-num", "1", str(JOB), "--sleep", "0", name="next", TMPDIR=str(tmp))
        assert nxt.wait() == 0, nxt.err
        assert not left.exists()
        assert kept.is_dir()
    finally:
        release.touch()
    assert live.wait() == 0, live.err
    assert not kept.exists()
    assert not list(tmp.glob("npu_migrate_launch_*"))
