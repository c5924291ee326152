"""``npu-migrate compare`` on hand-made recordings: alignment, tolerances, NaN, missing ranks and steps, inputs, exit codes.

Recordings are written here in the probe's file format (:mod:`npu_migrate.compare.records`), so
each edge case is exact and costs no training run; ``test_compare_runs.py`` makes real ones.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env, run_cli
from support import LOSSES, two_ranks, write_probe
from npu_migrate.compare.reading import report, tolerance
from npu_migrate.compare.reading.tolerance import Tolerance
from npu_migrate.compare.reading.verdict import compare

ENTRY_NAMES = ["conv", "relu", "fc"]


def stats(scale: float) -> list[float]:
    """min, max, mean, norm, nan, inf of a made-up tensor of magnitude ``scale``."""
    return [-scale, scale, scale / 10, scale * 4, 0.0, 0.0]


def module_rows(shift: dict[str, float] | None = None, nan_in: str | None = None) -> list[tuple[tuple, list[float]]]:
    """A chain conv -> relu -> fc, forward then backward; ``shift`` adds to a module's outputs (and what follows)."""
    shift = shift or {}
    rows: list[tuple[tuple, list[float]]] = []
    carried = 0.0
    value = 1.0
    for name in ENTRY_NAMES:
        rows.append(((name, 0, "forward", "input.0", "float32", (4, 8)), stats(value + carried)))
        carried += shift.get(name, 0.0)
        value *= 1.5
        out = stats(value + carried)
        if nan_in == name:
            out[4] = 1.0
            out[2] = math.nan
        rows.append(((name, 0, "forward", "output", "float32", (4, 8)), out))
    for name in reversed(ENTRY_NAMES):
        rows.append(((name, 0, "backward", "grad_output", "float32", (4, 8)), stats(0.1 + carried)))
        rows.append(((name, 0, "backward", "grad_input.0", "float32", (4, 8)), stats(0.2 + carried)))
    return rows


# ----------------------------------------------------------------------------------- tolerances


def test_dtype_table_is_torch_testings_own() -> None:
    torch = pytest.importorskip("torch")
    from torch.testing._comparison import _DTYPE_PRECISIONS

    for dtype, (rtol, atol) in _DTYPE_PRECISIONS.items():
        name = str(dtype).replace("torch.", "")
        if dtype.is_floating_point or dtype.is_complex:
            assert tolerance.DTYPE_TOLERANCES[name] == (rtol, atol), name
    assert torch.bfloat16 in _DTYPE_PRECISIONS


def test_tolerance_resolution() -> None:
    tol = Tolerance()
    assert tol.resolve("bfloat16") == pytest.approx((1.6e-2 * 8, 1e-5 * 8))
    assert tol.resolve("float32", "bfloat16") == tol.resolve("bfloat16"), "the loosest dtype decides"
    assert tol.resolve(None) == tol.resolve("float32")
    assert Tolerance(rtol=1e-3).resolve("bfloat16")[0] == 1e-3
    assert Tolerance(exact=True).resolve("bfloat16") == (0.0, 0.0)
    assert not Tolerance().close(math.nan, math.nan)
    assert Tolerance(exact=True).close(1.5, 1.5) and not Tolerance(exact=True).close(1.5, 1.5 + 1e-15)
    with pytest.raises(ValueError, match="--rtol -1.0 must be a finite number >= 0"):
        Tolerance(rtol=-1.0)
    with pytest.raises(ValueError, match="--exact allows no difference"):
        Tolerance(rtol=1e-3, exact=True)


# ----------------------------------------------------------------------------------- verdicts


def test_identical_recordings_pass_exactly(tmp_path: Path) -> None:
    mods = {s: module_rows() for s in LOSSES}
    a = two_ranks(tmp_path / "a", LOSSES, modules=mods)
    b = two_ranks(tmp_path / "b", LOSSES, modules=mods)
    result = compare(str(a), str(b), Tolerance(exact=True))
    assert result.passed and result.exit_code == 0 and result.max_abs == 0
    assert result.module_entries_compared == 2 * 4 * len(module_rows())


def test_culprit_is_the_first_module_with_close_inputs_and_differing_outputs(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES, modules={s: module_rows() for s in LOSSES})
    b = two_ranks(tmp_path / "b", LOSSES, modules={s: module_rows({"relu": 0.5}) for s in LOSSES})
    result = compare(str(a), str(b))
    assert not result.passed and result.first_step == 1
    assert result.culprit is not None
    assert (result.culprit.module, result.culprit.phase, result.culprit.step) == ("relu", "forward", 1)
    assert result.culprit.inherited[0] == "fc", "fc only inherited the error"
    assert result.culprit.worst["entry"] == "relu forward output"


def test_backward_culprit_when_forward_agrees(tmp_path: Path) -> None:
    good = module_rows()
    bad = [(e, list(row)) for e, row in good]
    for e, row in bad:  # relu's gradient for its input goes wrong; what conv receives inherits it
        if e[0] == "relu" and e[3] == "grad_input.0" or e[0] == "conv" and e[2] == "backward":
            row[3] *= 1.5
    a = two_ranks(tmp_path / "a", {1: 2.0}, modules={1: good})
    b = two_ranks(tmp_path / "b", {1: 2.0}, modules={1: bad})
    result = compare(str(a), str(b))
    assert (result.culprit.module, result.culprit.phase) == ("relu", "backward")
    assert result.culprit.inherited == ["conv"]


def test_nan_always_fails_even_with_a_budget(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    b = two_ranks(tmp_path / "b", {**LOSSES, 3: math.nan})
    result = compare(str(a), str(b), allow_failing_steps=10)
    assert not result.passed and result.nonfinite_steps == [3] and result.first_step == 3
    same = compare(str(b), str(b))
    assert not same.passed, "NaN is not close to NaN"


def test_nan_inside_a_module_record_fails(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES, modules={s: module_rows() for s in LOSSES})
    b = two_ranks(tmp_path / "b", LOSSES, modules={s: module_rows(nan_in="fc" if s == 2 else None) for s in LOSSES})
    result = compare(str(a), str(b), allow_failing_steps=4)
    assert not result.passed and result.nonfinite_steps == [2]
    assert result.culprit.module == "fc" and result.culprit.step == 2


def test_failing_step_budget(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    b = two_ranks(tmp_path / "b", {**LOSSES, 2: 2.2, 4: 1.8})
    assert compare(str(a), str(b), allow_failing_steps=1).exit_code == 1
    result = compare(str(a), str(b), allow_failing_steps=2)
    assert result.passed and result.failing_steps == [2, 4] and result.first_step == 2
    loss = result.metrics["loss"]
    assert loss.max_abs == pytest.approx(0.1) and loss.max_rel == pytest.approx(0.1 / 1.8)


def test_steps_out_of_step_are_reported_not_misaligned(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    b = two_ranks(tmp_path / "b", {1: 2.3, 2: 2.1, 3: 1.9, 5: 1.7})  # B skipped step 4 and went on
    result = compare(str(a), str(b))
    assert result.exit_code == 1 and result.failing_steps == []
    assert "rank 0: step(s) 4 only in A" in result.problems and "rank 0: step(s) 5 only in B" in result.problems
    assert compare(str(a), str(b), steps="1:3").passed, "--steps restricts the comparison"


def test_missing_rank_is_reported(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    write_probe(tmp_path / "b", 0, LOSSES, end=False)
    result = compare(str(a), str(tmp_path / "b"))
    assert result.exit_code == 1
    assert any("rank(s) 1 only in A" in p for p in result.problems)
    assert any("rank 0 did not exit cleanly" in n for n in result.notes)


def test_autocast_steps_loosen_the_tolerance(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", {1: 2.0})
    b = two_ranks(tmp_path / "b", {1: 2.02}, autocast="bfloat16")
    assert compare(str(a), str(b)).passed
    assert not compare(str(a), str(two_ranks(tmp_path / "c", {1: 2.02}))).passed


def test_tf32_and_hf32_steps_count_as_float16(tmp_path: Path) -> None:
    """A GPU's TF32 (or an NPU's HF32) float32 convolutions agree with a CPU run only to float16's precision."""
    a = two_ranks(tmp_path / "a", {1: 2.0})
    for fmt in ("tfloat32", "hfloat32"):
        b = two_ranks(tmp_path / fmt, {1: 2.0 * (1 + 5e-3)}, device="cuda", float32_math=fmt)
        result = compare(str(a), str(b))
        assert result.passed, result.problems
        assert f"| float32 math | float32 | {fmt} |" in report.markdown(result)
    # the same difference in plain float32 is a divergence, and float16's own bound still holds
    assert not compare(str(a), str(two_ranks(tmp_path / "ieee", {1: 2.0 * (1 + 5e-3)}))).passed
    assert not compare(str(a), str(two_ranks(tmp_path / "far", {1: 2.0 * 1.02}, float32_math="tfloat32"))).passed


def test_torn_last_line_after_a_crash_is_skipped(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    with open(a / "rank1.jsonl", "a") as fh:
        fh.write('{"kind": "step", "step": 5, "lo')
    result = compare(str(a), str(a))
    assert result.passed and any("unreadable line skipped" in n for n in result.notes)


def test_torn_line_before_an_appended_header_is_a_note_and_inf_is_a_number(tmp_path: Path) -> None:
    """What the strict reader (tests/security/test_compare_hostile.py) must still accept."""
    a = two_ranks(tmp_path / "a", LOSSES)
    header = (a / "rank0.jsonl").read_text().splitlines()[0]
    with open(a / "rank0.jsonl", "a") as fh:  # a crash tore a line, then a --probe-append run went on
        fh.write('{"kind": "step", "step": 5, "lo\n' + header + "\n")
        fh.write('{"kind": "step", "step": 5, "loss": 1e999999, "grad_norm": 1.0, "lr": 0.1}\n')
    result = run_cli("compare", str(a), str(a))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr  # inf fails, as NaN does
    assert "unreadable line skipped" in result.stdout


# ----------------------------------------------------------------------------------- other inputs


def test_metrics_jsonl_by_epoch_without_timings(tmp_path: Path) -> None:
    rows_a = [{"epoch": e, "train_loss": 1.0 / e, "test_accuracy": 0.9, "elapsed_s": e * 1.1, "samples_per_sec": 99.0,
               "device": "cuda"} for e in (1, 2)]
    rows_b = [dict(r, elapsed_s=r["elapsed_s"] * 3, samples_per_sec=10.0, device="npu") for r in rows_a]
    for name, rows in (("a.jsonl", rows_a), ("b.jsonl", rows_b)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = compare(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), Tolerance(exact=True))
    assert result.passed and set(result.metrics) == {"train_loss", "test_accuracy"}
    assert result.a.header["device"] == "cuda" and result.b.header["device"] == "npu"


def test_plain_logs_with_a_pattern(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("start\nstep 1 loss 2.5\nnoise\nstep 2 loss 2.25\n")
    (tmp_path / "b.log").write_text("step 1 loss 2.5\nstep 2 loss 2.75\n")
    pattern = r"step (?P<step>\d+) loss (?P<loss>\S+)"
    result = compare(str(tmp_path / "a.log"), str(tmp_path / "b.log"), pattern=pattern)
    assert result.exit_code == 1 and result.first_step == 2 and result.metrics["loss"].max_abs == 0.5


# ----------------------------------------------------------------------------------- the command


def test_cli_exit_codes_and_summary(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    b = two_ranks(tmp_path / "b", {**LOSSES, 3: 1.0})
    ok = run_cli("compare", str(a), str(a), "--exact")
    assert ok.returncode == 0 and ok.stdout.startswith("# npu-migrate compare: PASS")
    bad = run_cli("compare", str(a), str(b), "--json", str(tmp_path / "r.json"))
    assert bad.returncode == 1 and "**First step out of tolerance:** 3" in bad.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["first_step"] == 3 and data["exit_code"] == 1 and data["metrics"]["loss"]["failing"] == [[0, 3], [1, 3]]


@pytest.mark.parametrize("args, message", [
    (["missing_dir", "missing_dir"], "'missing_dir' does not exist"),
    (["{a}", "{a}", "--rtol", "-1"], "--rtol -1.0 must be a finite number >= 0"),
    (["{a}", "{a}", "--exact", "--atol", "1e-3"], "--exact allows no difference"),
    (["{a}", "{a}", "--steps", "9:1"], "--steps '9:1' is empty"),
    (["{a}", "{a}", "--allow-failing-steps", "-1"], "--allow-failing-steps -1 is negative"),
    (["{a}", "{a}", "--steps", "50:"], "no step in common"),
    (["{a}", "{log}"], "neither a --probe directory nor JSON lines"),
    (["{log}", "{log}", "--pattern", "nothing (?P<x>here)"], "matched no line"),
    (["{log}", "{log}", "--pattern", "(unclosed"], "is not a regular expression"),
])
def test_cli_usage_errors_exit_2_in_one_line(tmp_path: Path, args: list[str], message: str,
                                             capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate.compare.cli import main

    a = two_ranks(tmp_path / "a", LOSSES)
    log = tmp_path / "x.log"
    log.write_text("hello\n")
    monkeypatch.chdir(tmp_path)
    assert main([x.format(a=a, log=log) for x in args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_argparse_usage_error_exits_2(capsys: pytest.CaptureFixture) -> None:
    from npu_migrate.compare.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["only_one"])
    assert exc.value.code == 2 and "the following arguments are required: B" in capsys.readouterr().err


def test_compare_does_not_import_torch(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES, modules={s: module_rows() for s in LOSSES})
    code = ("import sys; from npu_migrate.compare.cli import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, str(a), str(a), "--exact", "--json", str(tmp_path / "j")],
                            env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_pure_python_path_agrees_with_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numpy")
    from npu_migrate.compare.reading import module_verdict, verdict

    a = two_ranks(tmp_path / "a", LOSSES, modules={s: module_rows() for s in LOSSES})
    b = two_ranks(tmp_path / "b", LOSSES, modules={s: module_rows({"relu": 1e-3} if s > 2 else None,
                                                                  nan_in="fc" if s == 4 else None) for s in LOSSES})
    fast = verdict.compare(str(a), str(b))
    monkeypatch.setattr(module_verdict, "_np", None)  # the module-record checks' numpy
    slow = verdict.compare(str(a), str(b))
    assert (fast.failing_steps, fast.nonfinite_steps, fast.culprit) == (slow.failing_steps, slow.nonfinite_steps,
                                                                        slow.culprit)
    assert fast.module_max_rel == pytest.approx(slow.module_max_rel)
    for rank in (0, 1):
        assert fast.module_ratio[rank] == pytest.approx(slow.module_ratio[rank])
