"""The launcher's output relay: whole lines per rank, prefixes, rank filters, log files, progress bars.

Two launches with real processes (one with two ranks printing unbuffered at full speed, one with
--log-dir, --tee, a filter and a restart after a SIGKILL), bad input through the command line
(refused before anything starts) and the relay's line handling on FIFOs in this process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS
from support import JOB, Launch, alive

from npu_migrate.autoload import ENV_AUTOLOAD
from npu_migrate.launch.cli import main
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.procs.output import Relay, fifo_paths
from npu_migrate.launch.setup.output_settings import output_settings

OUTPUT_JOB = LAUNCH_SCRIPTS / "output_job.py"
HOST = socket.gethostname()
LINES = 20_000


def _kill(pid_file: Path) -> None:
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.slow
def test_two_ranks_at_full_speed_never_mix_lines(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(OUTPUT_JOB), "--lines", str(LINES), "--progress", "--partial",
                 "--orphan", PYTHONUNBUFFERED="1")
    try:
        # Rank 0's orphan (another session) holds its stdout: the launcher still ends, after a bounded drain.
        assert job.wait() == 0, job.err
        assert alive(int((tmp_path / "orphan.pid").read_text()))
    finally:
        _kill(tmp_path / "orphan.pid")
    prefix = {r: f"[{HOST} node0 rank{r}] " for r in (0, 1)}  # the default with more than one rank
    counts = {0: 0, 1: 0}
    line_re = re.compile(r"\[\S+ node0 rank(\d)\] (\d):(\d+):([ab]{40})")
    out = job.outtext.split("\n")
    assert out[-1] == ""  # ends with a newline: the partial last line got one
    for line in out[:-1]:
        if line.startswith(prefix[0] + "tail of rank") or line.startswith(prefix[1] + "tail of rank"):
            continue
        m = line_re.fullmatch(line)
        assert m, f"mixed or broken line: {line!r}"
        rank = int(m.group(1))
        assert (m.group(2), m.group(4)) == (str(rank), "ab"[rank] * 40), f"mixed line: {line!r}"
        assert int(m.group(3)) == counts[rank], f"rank {rank}'s lines out of order or lost at {line!r}"
        counts[rank] += 1
    assert counts == {0: LINES, 1: LINES}
    for r in (0, 1):
        assert f"{prefix[r]}tail of rank {r}" in out
    raw_err = job.stderr.read_bytes().decode()  # read_text() would turn each \r into \n
    err = raw_err.split("\n")
    for r in (0, 1):  # stderr stays stderr, stdout stdout
        assert f"{prefix[r]}stderr from rank {r}" in err and f"stderr from rank {r}" not in job.outtext
        # Each \r update is its own prefixed segment; the bar ends with the newline.
        bar = "".join(f"{prefix[r]}rank {r} progress {p:3d}%\r" for p in (0, 50)) + f"{prefix[r]}rank {r} progress 100%"
        assert bar in raw_err, raw_err


@pytest.mark.slow
def test_log_dir_tee_filter_template_and_restart_logs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    args = ["--device-num", "2", "--max-restarts", "1", "--log-dir", str(logs), "--tee", "--local-ranks-filter", "1",
            "--log-line-prefix-template", "<${rank}/${local_rank}@${node_rank} ${role_name}>", str(OUTPUT_JOB),
            "--lines", "50", "--killed-first"]
    job = Launch(tmp_path, *args, PYTHONUNBUFFERED="1")
    assert job.wait() == 0, job.err
    assert "was killed by SIGKILL" in job.err and f"full output: {logs / 'rank0.log'}" in job.err
    assert "restarting the job (restart 1 of 1)" in job.err
    expected = {r: "".join(f"{r}:{i}:{'ab'[r] * 40}\n" for i in range(50)) for r in (0, 1)}
    # Attempt 0's logs stay as they were; restart 1 writes its own files. Files carry no prefix.
    for r in (0, 1):
        for name in (f"rank{r}.log", f"rank{r}.attempt1.log"):
            text = (logs / name).read_text()
            assert text.startswith(expected[r]) and f"stderr from rank {r}\n" in text, (name, text)
    # The console shows only local rank 1, prefixed by the template, from both attempts.
    shown = [f"<1/1@0 default>{line}" for line in expected[1].splitlines()]
    assert job.outtext.splitlines() == shown + shown
    assert "0:0:" not in job.outtext and "stderr from rank 0" not in job.err
    assert job.err.count("<1/1@0 default>stderr from rank 1") == 2

    # The same log dir again: refused before anything starts, naming the file and the ways on.
    again = Launch(tmp_path, "--device-num", "2", "--log-dir", str(logs), str(OUTPUT_JOB), name="again")
    assert again.wait() == 2
    assert again.err.strip() == (
        f"npu-migrate launch: error: --log-dir {logs} already holds rank0.log from an earlier run: pass a new "
        "--log-dir, remove the old logs, or add --log-append to append to them.")


@pytest.mark.parametrize(("args", "message"), [
    (["--local-ranks-filter", "0,x"], r"--local-ranks-filter '0,x' is not a list of local ranks \('x' is not one\)"),
    (["--local-ranks-filter", "0,2"], r"names local rank 2, but this node runs local ranks 0-1"),
    (["--log-line-prefix-template", "[${rank}] ${gpu}"], r"uses unknown \$\{gpu\}: expected \$\{role_name\}"),
    (["--log-line-prefix-template", "cost $5"], r"has a '\$' at position 5 that starts no variable"),
    (["--tee"], r"--tee needs --log-dir"),
    (["--log-dir", "{file}/logs"], r"--log-dir .*/afile/logs: .*/afile is not a directory"),
])
def test_bad_output_flags_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, args: list[str], message: str) -> None:
    monkeypatch.setenv(ENV_AUTOLOAD, os.environ.get(ENV_AUTOLOAD, "0"))  # main() may set it: keep it to this test
    (tmp_path / "afile").write_text("")
    args = [a.replace("{file}", str(tmp_path / "afile")) for a in args]
    assert main(["--device-num", "2", *args, str(OUTPUT_JOB)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err


def _relay_output(tmp_path: Path, capfd: pytest.CaptureFixture[str], chunks: list[bytes], **flags: object) -> tuple[str, str]:
    """Write ``chunks`` into a one-rank relay's stdout FIFO, as a worker would; return (stdout, log file)."""
    logs = tmp_path / "logs"
    cfg = LaunchConfig(nproc=1, log_dir=str(logs), output=output_settings(log_dir=str(logs), tee=True, **flags))
    logs.mkdir()
    relay = Relay(cfg.output, cfg, str(tmp_path), attempt=0)
    relay.start()
    fd = os.open(fifo_paths(str(tmp_path), 0)[0], os.O_WRONLY)
    for chunk in chunks:
        os.write(fd, chunk)
    os.close(fd)
    relay.drain()
    return capfd.readouterr().out, (logs / "rank0.log").read_bytes().decode()


def test_progress_bars_partial_lines_and_prefixes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # A tqdm-like bar (leading \r, cut across writes), a \r\n line end cut between its bytes, and a
    # last line without a newline.
    chunks = [b"start\n\r  0%|", b"   |\r 50%|#", b"  |\r100%|###|\n", b"windows\r", b"\nend"]
    out, log = _relay_output(tmp_path, capfd, chunks, template="[${rank}] ")
    assert out == "[0] start\n[0]   0%|   |\r[0]  50%|#  |\r[0] 100%|###|\n[0] windows\r\n[0] end\n"
    assert log == "start\n\r  0%|   |\r 50%|#  |\r100%|###|\nwindows\r\nend\n"  # as written, plus the newline


def test_an_empty_template_turns_the_prefix_off(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out, log = _relay_output(tmp_path, capfd, [b"a\nb", b"c\n"], template="")
    assert out == log == "a\nbc\n"


@pytest.mark.slow
def test_a_long_tmpdir_still_starts_the_job(tmp_path: Path) -> None:
    """The fork server's socket lives under TMPDIR; a long one (CI runners, nested temporary
    directories) must not end the launcher with "AF_UNIX path too long"."""
    deep = tmp_path / ("t" * 60) / ("u" * 40)
    deep.mkdir(parents=True)
    launch = Launch(tmp_path, "--device-num", "1", str(JOB), "--sleep", "0", TMPDIR=str(deep))
    assert launch.wait() == 0, launch.err
    assert "Traceback" not in launch.err
    assert json.loads((tmp_path / "rank0.json").read_text())["env"]["RANK"] == "0"
