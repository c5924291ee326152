"""One exit-code rule for every sub-command: 0 ok, 1 failure, 2 usage or unreadable input, 130 Ctrl-C, 141 closed pipe.

Each case runs ``npu_migrate.cli.main(argv)`` in this process (cheap: no interpreter start, no
torch import per case) and checks what a user sees: the exit code, exactly one line on stderr
that starts with the command's prefix (none for a closed pipe), never a traceback. A closed pipe
is a stdout whose writes fail with ``EPIPE``; Ctrl-C is a ``KeyboardInterrupt`` raised from inside
the command's own work. The real-pipe checks at the end run ``python -m`` as a user would.
"""

from __future__ import annotations

import errno
import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_env
from npu_migrate.cli import COMMANDS, main
from npu_migrate.errors import ExitCode

CUDA = "import torch\nx = torch.zeros(1).cuda()\n"
PROGS = {c.name: c.prog for c in COMMANDS}


class ClosedPipe(io.TextIOBase):
    """A stdout whose reader went away (``| head``): every write and flush fails with EPIPE."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no file descriptor")


def _metrics(path: Path, losses: list[float]) -> Path:
    path.write_text("".join(json.dumps({"epoch": e, "train_loss": x}) + "\n" for e, x in enumerate(losses, 1)))
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """The paths the cases name: scripts, sources, runs to compare, and things that are not what they should be."""
    (tmp_path / "ok.py").write_text("print('trained')\n")
    (tmp_path / "cuda.py").write_text(CUDA)
    (tmp_path / "broken.py").write_text("x = (\n")
    (tmp_path / "clean.py").write_text("x = 1\n")
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "empty.txt").write_text("")
    _metrics(tmp_path / "a.jsonl", [1.0, 0.5])
    _metrics(tmp_path / "b.jsonl", [1.0, 0.9])
    (tmp_path / "garbage.jsonl").write_text("{not json\n{\"also\": \n")
    paths = {p.name.replace(".py", "").replace(".", "_"): str(p) for p in tmp_path.iterdir()}
    paths.update(missing=str(tmp_path / "missing.py"))
    return paths


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() may turn torch's device-extension autoload off for this process: keep it to one case.
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    monkeypatch.setenv("NPU_MIGRATE_DEVICE", "cpu")


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str], stdout: object = None,
             entry=main) -> tuple[int, list[str]]:
    """``entry(argv)`` in this process: its exit code (argparse's SystemExit too) and its stderr lines."""
    capsys.readouterr()
    saved = sys.stdout
    if stdout is not None:
        sys.stdout = stdout
    try:
        code = entry(argv)
    except SystemExit as exc:  # argparse's usage errors, as a user's shell sees them
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdout = saved
    return int(code), capsys.readouterr().err.strip().splitlines()


def assert_one_line(code: int, err: list[str], expected: int, command: str, needle: str = "") -> None:
    assert code == expected, err
    assert len(err) == 1, err
    assert not any("Traceback" in line for line in err), err
    prefixes = (PROGS.get(command, "npu-migrate"), "npu-migrate", f"npu-migrate {command}")
    assert err[0].startswith(tuple(f"{p}: " for p in prefixes)), err
    assert needle in err[0], err


# --------------------------------------------------------------------------- 2: usage and unreadable input
USAGE = [
    ("env", ["env", "--device", "gpu"], "invalid choice: 'gpu'"),
    ("smoke", ["smoke", "--nproc", "0"], "--nproc 0 is not positive"),
    ("launch", ["launch", "--device", "cpu", "--device-num", "0", "{ok}"], "--device-num 0 is not positive"),
    ("launch", ["launch", "--device", "cpu", "{missing}"], "not found"),
    ("launch", ["launch", "--device", "cpu", "--migrate-report", "r.md", "{ok}"], "--migrate-report needs --migrate"),
    ("launch", ["launch", "--device", "cpu", "--probe-level", "modules", "{ok}"], "--probe"),
    ("run", ["run", "--device-num", "0", "{ok}"], "--device-num 0 is not positive"),
    ("run", ["run", "{missing}"], "not found"),
    ("port", ["port", "-j", "0", "{clean}"], "-j 0"),
    ("port", ["port", "{missing}"], "no such file or directory"),
    ("port", ["port", "{clean}", "--report", "{a_file}/r.md"], "a_file"),
    ("port", ["port", "{cuda}", "--out", "{a_file}/out"], "Not a directory"),
    ("check", ["check", "--select", "NM999", "{clean}"], "Unknown rule code 'NM999'"),
    ("ops", ["ops", "--steps", "0", "{ok}"], "--steps 0 is not positive"),
    ("ops", ["ops", "{missing}"], "not found"),
    ("ops", ["ops", "--op-list", "{missing}", "{ok}"], "cannot be read"),
    ("ops", ["ops", "--op-list", "{empty_txt}", "{ok}"], "names no operator"),
    ("advise", ["advise", "--steps", "0", "{ok}"], "--steps 0 is not positive"),
    ("advise", ["advise", "{missing}"], "not found"),
    ("compare", ["compare", "--exact", "--atol", "1", "{a_jsonl}", "{b_jsonl}"], "--exact allows no difference"),
    ("compare", ["compare", "{missing}", "{b_jsonl}"], "does not exist"),
    ("compare", ["compare", "{garbage_jsonl}", "{b_jsonl}"], "garbage.jsonl"),
    ("compare", ["compare", "{a_jsonl}", "{b_jsonl}", "--json", "{a_file}/r.json"], "cannot write the report"),
    ("stacks", ["stacks", "not-a-pid"], "invalid int value"),
]


@pytest.mark.parametrize(("command", "argv", "needle"), USAGE, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_usage_errors_and_unreadable_input_exit_2_in_one_line(command: str, argv: list[str], needle: str,
                                                              files: dict[str, str], capsys) -> None:
    code, err = run_main([a.format(**files) for a in argv], capsys)
    assert_one_line(code, err, ExitCode.USAGE, command, needle)


# --------------------------------------------------------------------------- 1: the command ran and failed
def test_failures_exit_1_in_one_line(files: dict[str, str], capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate import launch
    from npu_migrate.launch.errors import JobFailed

    cases = [
        ("env", ["env", "--device", "npu"], "torch_npu"),  # the family cannot be used here
        ("launch", ["launch", "--dry-run", "--device", "cpu", "--port", "{busy}", "{ok}"], "is in use on this host"),
        ("stacks", ["stacks", str(2**22 + 1)], "no process with pid"),
        ("port", ["port", "{broken}"], "does not parse"),          # reported; the rest would go on
        ("check", ["check", "{broken}"], "does not parse"),
        ("smoke", ["smoke", "--device", "cpu", "--nproc", "1"], "rank 0 failed"),
    ]
    def failed_job(*args: object, **kwargs: object) -> None:
        raise JobFailed("rank 0 failed: boom.", 1)

    monkeypatch.setattr(launch, "spawn", failed_job)
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        files = dict(files, busy=str(busy.getsockname()[1]))
        for command, argv, needle in cases:
            code, err = run_main([a.format(**files) for a in argv], capsys)
            errors = [line for line in err if ": error: " in line]
            assert code == ExitCode.FAILURE, (command, err)
            assert len(errors) == 1 and needle in errors[0], (command, err)
            assert not any("Traceback" in line for line in err), err


def test_findings_and_divergence_exit_1(files: dict[str, str], capsys) -> None:
    code, err = run_main(["check", files["cuda"]], capsys)
    assert code == ExitCode.FAILURE and err == []
    code, err = run_main(["compare", files["a_jsonl"], files["b_jsonl"]], capsys)
    assert code == ExitCode.FAILURE and err == []


# --------------------------------------------------------------------------- 141: the reader went away
CLOSED_PIPE = [
    ["env", "--json"],
    ["port", "--list-rules"],
    ["port", "{cuda}"],                                  # the diff
    ["check", "{cuda}"],                                 # the findings
    ["compare", "{a_jsonl}", "{b_jsonl}"],               # the summary
    ["launch", "--dry-run", "--device", "cpu", "--device-num", "2", "{ok}"],
]


@pytest.mark.parametrize("argv", CLOSED_PIPE, ids=" ".join)
def test_closed_pipe_exits_141_quietly(argv: list[str], files: dict[str, str], capsys) -> None:
    code, err = run_main([a.format(**files) for a in argv], capsys, stdout=ClosedPipe())
    assert code == ExitCode.CLOSED_PIPE == 141
    assert [line for line in err if "Traceback" in line or "Error" in line] == [], err


def test_the_stand_alone_entry_points_follow_the_same_rule(files: dict[str, str], capsys) -> None:
    """``python -m npu_migrate.launch`` and ``python -m npu_migrate.compare``: the same codes and lines."""
    from npu_migrate.compare.cli import main as compare_main
    from npu_migrate.launch.cli import main as launch_main

    dry_run = ["--dry-run", "--device", "cpu", files["ok"]]
    assert run_main(dry_run, capsys, ClosedPipe(), entry=launch_main) == (141, [])
    assert run_main([files["a_jsonl"], files["b_jsonl"]], capsys, ClosedPipe(), entry=compare_main) == (141, [])
    code, err = run_main(["--device", "cpu", files["missing"]], capsys, entry=launch_main)
    assert_one_line(code, err, 2, "launch", "not found")
    code, err = run_main([files["garbage_jsonl"], files["b_jsonl"]], capsys, entry=compare_main)
    assert_one_line(code, err, 2, "compare", "garbage.jsonl")
    assert run_main([files["a_jsonl"], files["b_jsonl"]], capsys, entry=compare_main) == (1, [])


# --------------------------------------------------------------------------- 130: Ctrl-C
INTERRUPT = [  # where the command is busy when Ctrl-C comes
    ("env", ["env"], "npu_migrate.env", "collect"),
    ("smoke", ["smoke", "--device", "cpu", "--nproc", "1"], "npu_migrate.launch", "spawn"),
    ("launch", ["launch", "--dry-run", "--device", "cpu", "{ok}"], "npu_migrate.launch.cli", "world_table"),
    ("run", ["run", "--device", "cpu", "{ok}"], "npu_migrate.compare.recording.settings", "from_args"),
    ("port", ["port", "{cuda}"], "npu_migrate.port.cli", "port_paths"),
    ("check", ["check", "{cuda}"], "npu_migrate.port.cli", "port_paths"),
    ("ops", ["ops", "{ok}"], "npu_migrate.ops.cli", "audit"),
    ("advise", ["advise", "{ok}"], "npu_migrate.ops.cli", "audit"),
    ("compare", ["compare", "{a_jsonl}", "{b_jsonl}"], "npu_migrate.compare.reading.verdict", "compare"),
    ("stacks", ["stacks", "1"], "npu_migrate.launch.hangs.stacks", "process_start"),
]


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(("command", "argv", "module", "name"), INTERRUPT, ids=lambda v: v if isinstance(v, str) else "")
def test_ctrl_c_exits_130_in_one_line(command: str, argv: list[str], module: str, name: str, files: dict[str, str],
                                      capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setattr(importlib.import_module(module), name, _interrupt)
    code, err = run_main([a.format(**files) for a in argv], capsys)
    assert_one_line(code, err, ExitCode.INTERRUPTED, command, "interrupted")


def test_every_sub_command_has_a_case() -> None:
    for table in (USAGE, INTERRUPT):
        assert {c.name for c in COMMANDS} == {case[0] for case in table}


# --------------------------------------------------------------------------- real pipes
def _into_a_closed_pipe(cmd: list[str]) -> tuple[int, str]:
    """Start ``cmd``, read one line of its output like ``| head -1``, close the pipe; its code and stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(120), err


def test_port_into_a_closed_pipe_exits_141(tmp_path: Path) -> None:
    # More diff than a pipe holds (64 KiB), so port is still writing when the reader leaves: few
    # lines (the parser's time), each long.
    note = "  # " + "n" * 400
    (tmp_path / "big.py").write_text("import torch\n" + "".join(f"x{i} = torch.zeros(1).cuda(){note}\n" for i in range(200)))
    code, err = _into_a_closed_pipe([sys.executable, "-m", "npu_migrate", "port", str(tmp_path / "big.py")])
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
