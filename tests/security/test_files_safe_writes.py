"""Reports, error files, recordings and logs are written whole, privately, and never through a symlink.

In a shared directory (``/tmp``, a team's run directory) another user can plant a symlink at the
name a tool is about to write, or at the temporary name it writes first, pointing at one of the
victim's files. Each test plants one and checks that the file it points at is untouched, that
the tool's own output is a regular file, and that it is private (0600) unless asked otherwise.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env, run_cli
from support import LOSSES, two_ranks

VICTIM_TEXT = "the victim's own file\n"


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim" / ".bashrc"
    path.parent.mkdir(exist_ok=True)
    path.write_text(VICTIM_TEXT)
    return path


def mode(path: Path) -> int:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode), f"{path} is not a regular file"
    return stat.S_IMODE(st.st_mode)


# --------------------------------------------------------------------------- the helper itself


def test_write_private_atomic_replaces_a_planted_symlink_and_is_private(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate import fileio

    target, bashrc = tmp_path / "shared" / "report.json", victim(tmp_path)
    target.parent.mkdir()
    target.symlink_to(bashrc)
    fileio.write_private_atomic(target, "{}\n")
    assert bashrc.read_text() == VICTIM_TEXT and target.read_text() == "{}\n" and mode(target) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]  # no temporary file left

    monkeypatch.setenv("NPU_MIGRATE_FILE_MODE", "640")
    fileio.write_private_atomic(target, "x")
    assert mode(target) == 0o640
    monkeypatch.setenv("NPU_MIGRATE_FILE_MODE", "rw-r--r--")
    with pytest.raises(fileio.FileModeError, match=r"^NPU_MIGRATE_FILE_MODE='rw-r--r--' is not a file mode for "
                                                   r"files their owner can read: expected octal digits"):
        fileio.write_private_atomic(target, "y")
    assert target.read_text() == "x"
    monkeypatch.delenv("NPU_MIGRATE_FILE_MODE")

    log = tmp_path / "shared" / "rank0.log"
    log.symlink_to(bashrc)
    with pytest.raises(OSError):
        fileio.open_private_append(log)
    assert bashrc.read_text() == VICTIM_TEXT


# --------------------------------------------------------------------------- the tools


def test_compare_reports_never_follow_a_symlink(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    bashrc = victim(tmp_path)
    out_json, out_md = tmp_path / "cmp.json", tmp_path / "cmp.md"
    out_json.symlink_to(bashrc)
    out_md.symlink_to(bashrc)
    result = run_cli("compare", str(a), str(a), "--json", str(out_json), "--markdown", str(out_md))
    assert result.returncode == 0, result.stderr
    assert bashrc.read_text() == VICTIM_TEXT
    assert json.loads(out_json.read_text())["passed"] and mode(out_json) == 0o600 and mode(out_md) == 0o600


@pytest.mark.slow
def test_migrate_report_never_follows_a_symlink(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import torch\ntorch.cuda.is_available()\nx = torch.zeros(2).cuda()\n")
    bashrc = victim(tmp_path)
    report = tmp_path / "report.md"
    report.symlink_to(bashrc)
    result = run_cli("run", "--device", "cpu", "--migrate-report", str(report), str(script))
    assert result.returncode == 0, result.stderr
    assert bashrc.read_text() == VICTIM_TEXT
    assert "runtime migration report" in report.read_text() and mode(report) == 0o600


def test_probe_file_is_private_and_never_appended_through_a_symlink(tmp_path: Path) -> None:
    import torch

    from npu_migrate.compare import Probe, ProbeError

    def one_step() -> None:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()

    with Probe(tmp_path / "own"):
        one_step()
    assert mode(tmp_path / "own" / "rank0.jsonl") == 0o600

    bashrc = victim(tmp_path)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "rank0.jsonl").symlink_to(bashrc)
    with pytest.raises(ProbeError, match=r"cannot be opened: .*\(it is a symlink: probe files are never written "
                                         r"through one\)"):
        with Probe(tmp_path / "shared", append=True):  # as under the launcher, which checked the directory
            one_step()
    assert bashrc.read_text() == VICTIM_TEXT


SCRIPT = """
import sys
with open(sys.argv[1]) as gate:   # blocks until the test has planted its symlink and opens the FIFO
    gate.read()
raise SystemExit(3)
"""


@pytest.mark.slow
def test_error_file_and_logs_are_private_and_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """The launcher wrote ``FILE.tmp<its pid>`` with a plain open(): a symlink planted there was followed."""
    bashrc = victim(tmp_path)
    script, gate = tmp_path / "job.py", tmp_path / "gate"
    script.write_text(SCRIPT)
    os.mkfifo(gate)
    shared = tmp_path / "shared"
    shared.mkdir()
    error_file = shared / "error.json"
    proc = subprocess.Popen([sys.executable, "-m", "npu_migrate.launch", "--device-num", "1", "--error-file",
                             str(error_file), "--log-dir", str(shared / "logs"), str(script), str(gate)],
                            env=child_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for name in (f"error.json.tmp{proc.pid}", f".error.json.tmp{proc.pid}"):
            (shared / name).symlink_to(bashrc)
        with open(gate, "w") as fh:  # the job goes on only now
            fh.write("go\n")
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert bashrc.read_text() == VICTIM_TEXT
    report = json.loads(error_file.read_text())
    assert report["ranks"][0]["exit_code"] == 3 and mode(error_file) == 0o600
    logs = sorted((shared / "logs").glob("*.log"))
    assert logs and all(mode(p) == 0o600 for p in logs), [(p, oct(mode(p))) for p in logs]
    assert all(mode(p) == 0o600 for p in (shared / "logs").glob("report-node*.json"))
