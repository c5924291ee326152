"""``npu-migrate run`` of a torchrun-style script: one line that gives the ``launch --migrate`` command.

``run`` runs one process, as ``python train.py`` does; a script that needs the launcher's
``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` (read from ``os.environ`` or by ``init_process_group``'s
``env://`` rendezvous) ends in one line, exit 1, naming the command that starts it as ranks. The
end-to-end tests run that command as printed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_env, run_cli

SCRIPTS = Path(__file__).with_name("scripts")
ADVICE = "Start it as ranks: "


def _advice(stderr: str) -> list[str]:
    """The command the one line gives, as words, run as ``python -m npu_migrate``."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    words = shlex.split(lines[0].split(ADVICE, 1)[1])
    assert words[:3] == ["npu-migrate", "launch", "--migrate"], words
    return [sys.executable, "-m", "npu_migrate", *words[1:]]


@pytest.mark.slow
def test_the_readme_run_example_on_a_torchrun_script_says_what_to_do_and_that_works(tmp_path: Path) -> None:
    script = SCRIPTS / "cuda_torchrun.py"  # reads LOCAL_RANK on line 17, nccl, DDP; the line names it from ROOT
    result = run_cli("run", "--device", "cpu", "--device-num", "2", str(script),
                     env=child_env(OUT_DIR=str(tmp_path)))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"npu-migrate: error: {script.relative_to(ROOT)}:17 needs LOCAL_RANK, which torchrun sets for each rank: "
        f"a torchrun-style script runs as ranks, and run starts one process. Start it as ranks: "
        f"npu-migrate launch --migrate --device cpu --device-num 2 {script}"
    ]
    assert not list(tmp_path.iterdir())  # it stopped before its work
    job = subprocess.run(_advice(result.stderr), env=child_env(OUT_DIR=str(tmp_path)), capture_output=True,
                         text=True, timeout=180, cwd=ROOT)
    assert job.returncode == 0, job.stderr
    got = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [(r["rank"], r["backend"], r["device_count"]) for r in got] == [(0, "gloo", 2), (1, "gloo", 2)]
    assert got[0]["params"] == got[1]["params"]


@pytest.mark.slow
def test_init_process_group_env_rendezvous_names_the_variable_and_the_command(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch, torch.distributed as dist\n\n"
                      "dist.init_process_group('nccl')\n"
                      "x = torch.ones(1, device='cuda')\n"
                      "dist.all_reduce(x)\n"
                      "print(f'rank {dist.get_rank()} of {dist.get_world_size()}: {x.item()}', flush=True)\n"
                      "dist.destroy_process_group()\n")
    result = run_cli("run", "--device", "cpu", "--device-num", "2", str(script), "--lr", "0.1 x")
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"npu-migrate: error: {script}:3 needs RANK, which torchrun sets for each rank"), line
    assert line.endswith(f"launch --migrate --device cpu --device-num 2 {script} --lr '0.1 x'"), line
    job = subprocess.run(_advice(result.stderr), env=child_env(), capture_output=True, text=True, timeout=180,
                         cwd=ROOT)
    assert job.returncode == 0, job.stderr
    said = sorted(line.split("] ", 1)[1] for line in job.stdout.splitlines())  # after "[host node0 rank1] "
    assert said == ["rank 0 of 2: 2.0", "rank 1 of 2: 2.0"], job.stdout


@pytest.mark.slow
def test_a_script_that_reads_rank_with_a_default_runs_in_one_process_and_other_keys_keep_their_traceback(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os, torch\n"
                      "print('rank', int(os.environ.get('RANK', 0)), torch.cuda.device_count(), flush=True)\n"
                      "os.environ['DATA_ROOT']\n")
    result = run_cli("run", "--device", "cpu", "--device-num", "2", str(script))
    assert result.returncode == 1
    assert result.stdout == "rank 0 2\n"
    assert "Traceback" in result.stderr and result.stderr.strip().endswith("KeyError: 'DATA_ROOT'")
    assert "launch --migrate" not in result.stderr


# ---------------------------------------------------------------------------- how run tells, in-process


def test_a_missing_launcher_variable_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate.migrate.cli import launcher_variable

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "DATA_ROOT"):
        monkeypatch.delenv(name, raising=False)
    import os

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        with pytest.raises(KeyError) as caught:
            os.environ[name]
        assert launcher_variable(caught.value) == name
    with pytest.raises(KeyError) as other:
        os.environ["DATA_ROOT"]
    assert launcher_variable(other.value) is None
    assert launcher_variable(KeyError("RANK", "more")) is None and launcher_variable(ValueError("RANK")) is None
    monkeypatch.setenv("RANK", "0")  # set: the KeyError was about something else
    assert launcher_variable(KeyError("RANK")) is None


def test_torch_env_rendezvous_error_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own ValueError, from this torch (its wording is what the match reads)."""
    import torch.distributed as dist

    from npu_migrate.migrate.cli import launcher_variable

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError) as caught:
        next(dist.rendezvous("env://"))
    assert launcher_variable(caught.value) == "RANK"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError) as master:
        next(dist.rendezvous("env://"))
    assert "MASTER_ADDR" in str(master.value) and launcher_variable(master.value) is None  # not the rank's


def test_the_launch_command_keeps_runs_own_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate.migrate.cli import launch_command

    args = argparse.Namespace(device="cpu", device_num=2, module=False, script="my train.py", script_args=["--x", "1"],
                              command_line=True)
    monkeypatch.setattr(sys, "argv", ["npu-migrate", "-v", "run", "--user-code", "src", "--device", "cpu",
                                      "--device-num", "2", "my train.py", "--x", "1"])
    assert launch_command(args) == ("npu-migrate -v launch --migrate --user-code src --device cpu --device-num 2 "
                                    "'my train.py' --x 1")
    args.command_line = False  # called from Python: what the arguments say
    assert launch_command(args) == "npu-migrate launch --migrate --device cpu --device-num 2 'my train.py' --x 1"
    module = argparse.Namespace(device=None, device_num=None, module=True, script="pkg.train", script_args=[],
                                command_line=False)
    assert launch_command(module) == "npu-migrate launch --migrate -m pkg.train"


def test_a_read_without_default_handed_to_int_names_the_variable_and_the_command(tmp_path: Path) -> None:
    """``int(os.environ.get("LOCAL_RANK"))`` and ``int(os.getenv("WORLD_SIZE"))`` (no default) end in
    TypeError about a None: the same one line as ``os.environ["LOCAL_RANK"]``."""
    reads = (('int(os.environ.get("LOCAL_RANK"))', "LOCAL_RANK"), ("int(os.getenv('WORLD_SIZE'))", "WORLD_SIZE"))
    for read, name in reads:
        script = tmp_path / "train.py"
        script.write_text(f"import os\nimport torch\nlocal_rank = {read}\nprint('after', flush=True)\n")
        result = run_cli("run", "--device", "cpu", "--device-num", "2", str(script))
        assert result.returncode == 1, result.stderr
        assert result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            f"npu-migrate: error: {script}:3 needs {name}, which torchrun sets for each rank: a torchrun-style "
            f"script runs as ranks, and run starts one process. Start it as ranks: "
            f"npu-migrate launch --migrate --device cpu --device-num 2 {script}"
        ]


def test_a_none_read_is_recognised_only_on_the_line_that_read_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from npu_migrate.migrate.cli import launcher_variable

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "DATA_ROOT"):
        monkeypatch.delenv(name, raising=False)

    def raised(read):  # noqa: ANN001, ANN202 - the TypeError the call raises
        with pytest.raises(TypeError) as caught:
            read()
        return caught.value

    assert launcher_variable(raised(lambda: int(os.environ.get("LOCAL_RANK")))) == "LOCAL_RANK"
    assert launcher_variable(raised(lambda: int(os.getenv("RANK")))) == "RANK"
    assert launcher_variable(raised(lambda: int(os.environ.get("DATA_ROOT")))) is None  # not the launcher's
    assert launcher_variable(raised(lambda: int(os.getenv("RANK")) + int(os.getenv("WORLD_SIZE")))) is None  # which?
    value = None
    assert launcher_variable(raised(lambda: int(value))) is None  # no read on the line
    assert launcher_variable(raised(lambda: len(os.getenv("RANK", 0)))) is None  # a default: not unset-as-None
    monkeypatch.setenv("RANK", "0")
    assert launcher_variable(raised(lambda: int(os.getenv("RANK")) + None)) is None  # set: about something else
