"""The probe itself: the Python API, its safety rules, and real jobs that crash, hit NaN or filter everything out.

Jobs run ``tests/compare/scripts/tiny_train.py`` (two linear layers, DDP on 2 CPU ranks, a few
steps) through ``python -m npu_migrate.launch`` and ``npu-migrate run``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, child_env, run_cli
from npu_migrate.compare import Probe, ProbeError
from npu_migrate.compare.records import read_rank_file
from npu_migrate.compare.recording.settings import StepRange, parse_ranks
from npu_migrate.compare.reading.verdict import compare

TINY = Path(__file__).with_name("scripts") / "tiny_train.py"


def launch(tmp: Path, *args: str, script_args: tuple = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", *args, str(TINY), *script_args]
    return subprocess.run(cmd, env=child_env(), cwd=tmp, capture_output=True, text=True, timeout=180)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def train(model: torch.nn.Module, steps: int, *, amp: bool = False) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = model(torch.randn(4, 8, generator=gen)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Tanh(), torch.nn.Linear(16, 2))


# ----------------------------------------------------------------------------------- Python API


def test_api_records_steps_and_modules_and_removes_its_hooks(tmp_path: Path) -> None:
    backward = torch.Tensor.backward
    with Probe(tmp_path / "p", level="modules", modules=r"^[03]$", steps="2:3"):
        assert torch.Tensor.backward is not backward
        train(tiny_model(), 4)
    assert torch.Tensor.backward is backward, "stop() restores Tensor.backward"
    rec = read_rank_file(str(tmp_path / "p" / "rank0.jsonl"), 0)
    assert sorted(rec.steps) == [1, 2, 3, 4] and sorted(rec.modules) == [2, 3]
    entries = rec.modules[2][0]
    assert {e.module for e in entries} == {"0", "3"}
    assert [e.slot for e in entries if e.module == "0" and e.phase == "backward"] == ["grad_output", "grad.bias",
                                                                                      "grad.weight"] or \
        {e.slot for e in entries if e.module == "0" and e.phase == "backward"} == {"grad_output", "grad.bias",
                                                                                   "grad.weight"}
    assert rec.end is not None and rec.end["module_records"] == 2 * len(entries)


def test_api_refuses_an_existing_rank_file_unless_appending(tmp_path: Path) -> None:
    with Probe(tmp_path / "p"):
        train(tiny_model(), 1)
    with pytest.raises(ProbeError, match=r"rank0.jsonl' already exists; nothing was overwritten"):
        with Probe(tmp_path / "p"):
            train(tiny_model(), 1)
    with Probe(tmp_path / "p", append=True):
        train(tiny_model(), 2)
    rec = read_rank_file(str(tmp_path / "p" / "rank0.jsonl"), 0)
    assert len(rec.headers) == 2 and sorted(rec.steps) == [1, 2], "the appended run's steps follow its own header"


def test_api_filter_matching_nothing_is_an_error_at_stop(tmp_path: Path) -> None:
    probe = Probe(tmp_path / "p", level="modules", modules="no_such_layer").start()
    train(tiny_model(), 1)
    with pytest.raises(ProbeError, match=r"--probe-modules 'no_such_layer' matched none of the 5 modules"):
        probe.stop()
    end = lines(tmp_path / "p" / "rank0.jsonl")[-1]
    assert end["kind"] == "end" and end["module_records"] == 0 and "no_such_layer" in end["unmatched"][0]


def test_seed_checkpoint_and_dropout_off_make_two_models_identical(tmp_path: Path) -> None:
    init = tmp_path / "init.pt"
    for name, seed in (("a", 0), ("b", 1)):  # different random initialisation and dropout masks
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
        with Probe(tmp_path / name, level="modules", seed_checkpoint=str(init), no_dropout=True):
            train(model, 2)
        assert init.exists()
    assert compare(str(tmp_path / "a"), str(tmp_path / "b"), exact_tolerance()).passed


def exact_tolerance():
    from npu_migrate.compare.reading.tolerance import Tolerance

    return Tolerance(exact=True)


def test_bf16_autocast_is_recorded_per_step(tmp_path: Path) -> None:
    with Probe(tmp_path / "p"):
        train(tiny_model(), 2, amp=True)
    rec = read_rank_file(str(tmp_path / "p" / "rank0.jsonl"), 0)
    assert rec.autocast == {1: "bfloat16", 2: "bfloat16"}


@pytest.mark.parametrize("text, message", [
    ("0:x", "is not a step range"), ("5:2", "is empty"), ("0", "steps count from 1"),
])
def test_bad_step_ranges(text: str, message: str) -> None:
    with pytest.raises(ProbeError, match=message):
        StepRange.parse(text)


def test_ranges_and_rank_lists() -> None:
    assert 3 in StepRange.parse("2:4") and 5 not in StepRange.parse("2:4") and 9 in StepRange.parse("2:")
    assert parse_ranks("0,2-3") == (0, 2, 3) and parse_ranks("") is None
    with pytest.raises(ProbeError, match="is not a list of ranks"):
        parse_ranks("a")


# ----------------------------------------------------------------------------------- launcher and run


def test_launcher_refuses_an_existing_directory_and_stray_flags(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "rank0.jsonl").write_text("{}\n")
    result = launch(tmp_path, "--probe", str(tmp_path / "old"))
    assert result.returncode == 2
    assert "already exists with 1 file(s); nothing was overwritten" in result.stderr
    assert "--probe-append" in result.stderr and (tmp_path / "old" / "rank0.jsonl").read_text() == "{}\n"
    result = launch(tmp_path, "--probe-level", "modules")
    assert result.returncode == 2 and "--probe-level needs --probe DIR" in result.stderr
    result = launch(tmp_path, "--probe", str(tmp_path / "new"), "--probe-modules", "x")
    assert result.returncode == 2 and "add --probe-level modules" in result.stderr
    result = launch(tmp_path, "--probe", str(tmp_path / "new"), "--probe-level", "modules", "--probe-modules", "(")
    assert result.returncode == 2 and "is not a regular expression" in result.stderr


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("full")
    result = launch(tmp, "--probe", str(tmp / "full"), "--probe-level", "modules", script_args=("--steps", "6"))
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp / "full"


@pytest.mark.long
def test_crash_mid_run_keeps_every_record_written_before_it(full_run: Path, tmp_path: Path) -> None:
    result = launch(tmp_path, "--probe", str(tmp_path / "crash"), "--probe-level", "modules",
                    script_args=("--steps", "6", "--kill-at", "4"))
    assert result.returncode != 0 and "SIGKILL" in result.stderr
    for rank in (0, 1):
        rec = read_rank_file(str(tmp_path / "crash" / f"rank{rank}.jsonl"), rank)
        assert sorted(rec.steps)[:3] == [1, 2, 3] and sorted(rec.modules)[:3] == [1, 2, 3]
    assert read_rank_file(str(tmp_path / "crash" / "rank1.jsonl"), 1).end is None
    assert compare(str(full_run), str(tmp_path / "crash"), exact_tolerance(), steps="1:3").passed
    diverged = compare(str(full_run), str(tmp_path / "crash"))
    assert diverged.exit_code == 1 and any("only in A" in p for p in diverged.problems)


@pytest.mark.long
def test_nan_in_a_real_run_fails_and_points_at_the_data(full_run: Path, tmp_path: Path) -> None:
    result = launch(tmp_path, "--probe", str(tmp_path / "nan"), "--probe-level", "modules",
                    script_args=("--steps", "6", "--nan-at", "3"))
    assert result.returncode == 0, result.stderr[-3000:]
    cmp = run_cli("compare", str(full_run), str(tmp_path / "nan"), "--allow-failing-steps", "10")
    assert cmp.returncode == 1 and "NaN/Inf at step(s) 3" in cmp.stdout
    assert "already in what the first recorded module received" in cmp.stdout


@pytest.mark.slow
def test_filter_matching_nothing_warns_then_fails_the_job(tmp_path: Path) -> None:
    result = launch(tmp_path, "--probe", str(tmp_path / "p"), "--probe-level", "modules", "--probe-modules", "conv",
                    script_args=("--steps", "2",))
    assert result.returncode == 1
    assert "warning: --probe-modules 'conv' matched none of the 4 modules seen in step 1" in result.stderr
    assert "error: --probe" in result.stderr and "matched none of the 4 modules (TinyNet, act, fc1, fc2)" in result.stderr


@pytest.mark.slow
@pytest.mark.every_torch  # torch 2.1's torch.compile turns torch's own optimizer step hooks off for good
def test_a_script_that_compiles_is_recorded_step_by_step(tmp_path: Path) -> None:
    result = launch(tmp_path, "--probe", str(tmp_path / "p"), script_args=("--steps", "3", "--compile-a-function"))
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        rec = read_rank_file(str(tmp_path / "p" / f"rank{rank}.jsonl"), rank)
        assert sorted(rec.steps) == [1, 2, 3] and rec.end is not None


COMPILED = Path(__file__).with_name("scripts") / "compiled_model.py"


@pytest.mark.slow
@pytest.mark.every_torch  # torch 2.1's dynamo compiles the frames a compiled model calls, hooks' too
@pytest.mark.parametrize("level", ["steps", "modules"])
def test_a_model_compiled_before_its_first_forward_trains_as_it_would_without_the_probe(
        tmp_path: Path, level: str) -> None:
    """The probe's hooks never enter a compiled graph (fullgraph=True breaks on nothing): steps are
    recorded; modules inside a compiled region are not (the hooks would change the graph), which
    the job's end says with its fix, and TORCHDYNAMO_DISABLE=1 records them under the model's names."""
    plain = subprocess.run([sys.executable, str(COMPILED), "--fullgraph"], capture_output=True, text=True,
                           timeout=240, env=child_env(), cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    probe = tmp_path / "p"
    result = run_cli("run", "--probe", str(probe), "--probe-level", level, str(COMPILED), "--fullgraph", timeout=240)
    assert result.stdout == plain.stdout, result.stderr[-3000:]  # the same losses, every step
    rec = read_rank_file(str(probe / "rank0.jsonl"), 0)
    assert sorted(rec.steps) == [1, 2, 3]
    if level == "steps":
        assert result.returncode == 0, result.stderr[-3000:]
        return
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"npu-migrate: error: --probe {probe}: no module ran forward outside torch.compile: the model ran "
        "compiled, and the modules inside torch.compile are not recorded (the hooks would change the compiled "
        "graph); to record them, run with TORCHDYNAMO_DISABLE=1 (the model then runs eagerly)."), result.stderr[-3000:]
    again = run_cli("run", "--probe", str(tmp_path / "eager"), "--probe-level", "modules", str(COMPILED),
                    "--fullgraph", env=child_env(TORCHDYNAMO_DISABLE="1"), timeout=240)
    assert again.returncode == 0 and again.stdout == plain.stdout, again.stderr[-3000:]
    eager = read_rank_file(str(tmp_path / "eager" / "rank0.jsonl"), 0)
    names = {entry.module for entries, _ in eager.modules.values() for entry in entries}
    assert names == {"Sequential", "0", "1", "2"}  # the model's own names, not _orig_mod.0


@pytest.mark.slow
def test_npu_migrate_run_records_a_plain_process(tmp_path: Path) -> None:
    result = run_cli("run", "--device", "cpu", "--probe", str(tmp_path / "p"), str(TINY), "--steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    rec = read_rank_file(str(tmp_path / "p" / "rank0.jsonl"), 0)
    assert sorted(rec.steps) == [1, 2] and rec.header["world_size"] == 1 and rec.end is not None
    assert not (tmp_path / "p" / "rank1.jsonl").exists()
