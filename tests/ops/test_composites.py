"""``npu-migrate ops`` follows composite kernels to what they call, and says ``no_kernel`` where nothing can run.

Against the real wheels of 2.1.0.post17 and 2.14.0 (cached; a missing one skips): an operator the
release does not register whose torch kernel is composite runs that kernel on the NPU, so what the
kernel calls is recorded and judged, with the user's call site, the torch function and the
composites on the way (:mod:`npu_migrate.ops.follow`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ops.conftest import registers

from npu_migrate.cli import main
from npu_migrate.ops.follow import wrap_numbers
from npu_migrate.ops.verdict import Judge, Verdict
from npu_migrate.releases.operators import OperatorList

SCRIPTS = Path(__file__).with_name("scripts")
BOTH = pytest.mark.parametrize("release", ["2.1.0.post17", "2.14.0"], indirect=True)


def audit(tmp_path: Path, script: str, *extra: str, release: str) -> tuple[int, dict]:
    out = tmp_path / "ops.json"
    code = main(["ops", "--torch-npu", release, "--json", str(out), *extra, str(SCRIPTS / script)])
    return code, json.loads(out.read_text())


def ops_named(data: dict, op: str) -> list[dict]:
    return [o for o in data["ops"] if o["op"] == op]


def one(data: dict, op: str, overload: str, phase: str) -> dict:
    (found,) = [o for o in ops_named(data, op) if o["overload"] == overload and o["phase"] == phase]
    return found


@BOTH
def test_composite_callees_are_host_fallbacks_with_site_and_composite(
        tmp_path: Path, release: str, capsys: pytest.CaptureFixture) -> None:
    code, data = audit(tmp_path, "composite_train.py", release=release)
    assert code == 1 and data["steps"] == 2 and data["verdict"] == "cpu_fallback"
    # torch.logcumsumexp: decomposed itself; its kernel's aten::_logcumsumexp runs on the host.
    forward = one(data, "aten::_logcumsumexp", "default", "forward")
    assert forward["verdict"] == "cpu_fallback" and forward["via"] == ["aten::logcumsumexp"]
    assert forward["site"].endswith("composite_train.py:13") and forward["function"] == "torch.logcumsumexp"
    assert forward["count"] == 2 and forward["dtypes"] == ["float32"]
    assert one(data, "aten::logcumsumexp", "default", "forward")["verdict"] == "decomposed"
    # Its backward calls logcumsumexp twice a step, each through the same kernel.
    backward = one(data, "aten::_logcumsumexp", "default", "backward")
    assert backward["verdict"] == "cpu_fallback" and backward["via"] == ["aten::logcumsumexp"]
    assert backward["site"].endswith("composite_train.py:17") and backward["count"] == 4
    # huber_loss's backward: composite over its out= kernel, which no release registers.
    huber = one(data, "aten::huber_loss_backward", "out", "backward")
    assert huber["verdict"] == "cpu_fallback" and huber["via"] == ["aten::huber_loss_backward"]
    assert huber["site"].endswith("composite_train.py:17") and huber["count"] == 2
    assert one(data, "aten::huber_loss_backward", "default", "backward")["verdict"] == "decomposed"
    # bitwise_left_shift by a number: 2.14.0 registers that overload; 2.1.0.post17 runs the composite
    # over the .Tensor overload, which it lacks (the kernel's wrapped scalar reaches it as a tensor).
    shift = [o for o in ops_named(data, "aten::bitwise_left_shift") if o["site"].endswith("composite_train.py:14")]
    scalar_registered = registers(release, "bitwise_left_shift.Tensor_Scalar")
    if scalar_registered:
        assert [(o["overload"], o["verdict"], o["via"]) for o in shift] == [("Tensor_Scalar", "npu", [])]
    else:
        (tensor,) = [o for o in shift if o["overload"] == "Tensor"]
        assert tensor["verdict"] == "cpu_fallback" and tensor["via"] == ["aten::bitwise_left_shift.Tensor_Scalar"]
        assert tensor["function"] == "torch.bitwise_left_shift" and tensor["dtypes"] == ["int64"]
    shown = capsys.readouterr().out
    assert "composite_train.py:13 → `aten::logcumsumexp` → `aten::_logcumsumexp`: CPU fallback (forward" in shown
    assert "composite_train.py:17 → `aten::huber_loss_backward` → `aten::huber_loss_backward.out`: CPU fallback" \
        in shown
    assert ("composite_train.py:14 → `aten::bitwise_left_shift.Tensor_Scalar` → `aten::bitwise_left_shift.Tensor`"
            in shown) == (not scalar_registered)


@BOTH
def test_every_followed_composite_has_its_callees_recorded(tmp_path: Path, release: str) -> None:
    """Fails if a composite the NPU runs is recorded without what its kernel called."""
    _, data = audit(tmp_path, "composite_train.py", release=release)
    chains = {(o["site"], o["phase"], tuple(o["via"])) for o in data["ops"] if o["via"]}
    for composite, overload in (("aten::logcumsumexp", "default"), ("aten::huber_loss_backward", "default")):
        label = composite if overload == "default" else f"{composite}.{overload}"
        for entry in [o for o in ops_named(data, composite) if o["overload"] == overload]:
            assert entry["verdict"] == "decomposed"
            assert (entry["site"], entry["phase"], (*entry["via"], label)) in chains, (
                f"{label} at {entry['site']} ({entry['phase']}): its kernel's callees were not recorded")
    # Each callee's chain starts at an operator recorded at the same site and phase.
    recorded = {(o["op"] if o["overload"] == "default" else f"{o['op']}.{o['overload']}", o["site"], o["phase"])
                for o in data["ops"]}
    for site, phase, via in chains:
        assert (via[0], site, phase) in recorded


@BOTH
def test_meta_reports_a_callee_without_a_meta_kernel(tmp_path: Path, release: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    """Under --meta, aten::_logcumsumexp (no meta kernel) is still the host fallback of logcumsumexp."""
    code, data = audit(tmp_path, "composite_train.py", "--meta", release=release)
    assert code == 1 and data["verdict"] == "cpu_fallback"
    forward = one(data, "aten::_logcumsumexp", "default", "forward")
    assert forward["verdict"] == "cpu_fallback" and forward["via"] == ["aten::logcumsumexp"]
    assert forward["site"].endswith("composite_train.py:13") and forward["count"] == 2
    backward = one(data, "aten::_logcumsumexp", "default", "backward")
    assert backward["via"] == ["aten::logcumsumexp"] and backward["count"] == 4
    assert "composite_train.py:13 → `aten::logcumsumexp` → `aten::_logcumsumexp`: CPU fallback (forward" \
        in capsys.readouterr().out


@BOTH
def test_a_cuda_extensions_operator_has_no_kernel(tmp_path: Path, release: str,
                                                  capsys: pytest.CaptureFixture) -> None:
    code, data = audit(tmp_path, "cuda_extension_op.py", "--meta", release=release)
    assert code == 1 and data["steps"] == 2 and data["verdict"] == "no_kernel"
    (op,) = ops_named(data, "npu_migrate_demo::scaled_gelu")
    assert op["verdict"] == "no_kernel" and op["count"] == 2 and op["site"].endswith("cuda_extension_op.py:17")
    assert "CUDA extension" in op["hint"] and data["summary"]["no_kernel"] == 2
    shown = capsys.readouterr().out
    assert "| `npu_migrate_demo::scaled_gelu.default` | no_kernel | 1 | float32 |" in shown
    assert "| phase | npu | decomposed | cpu_fallback | no_kernel | error |" in shown


def test_verdicts_of_composites_and_of_operators_nothing_can_run() -> None:
    judge = Judge(OperatorList("none", "file", frozenset({"as_strided"}), frozenset()))
    key = torch._C.DispatchKey
    assert judge.verdict("aten::logcumsumexp", "default") is Verdict.DECOMPOSED
    assert judge.follow("aten::logcumsumexp", "default") == key.CompositeExplicitAutograd
    assert judge.follow("aten::huber_loss_backward", "default") == key.CompositeExplicitAutograd
    assert judge.follow("aten::to", "dtype") == key.CompositeImplicitAutograd
    # Not structured: its CompositeExplicitAutogradNonFunctional kernel is followed.
    assert judge.verdict("aten::select_backward", "default") is Verdict.DECOMPOSED
    assert judge.follow("aten::select_backward", "default") == key.CompositeExplicitAutogradNonFunctional
    # A structured functional form is judged as its out= delegate: allocate, then call it.
    assert judge.verdict("aten::special_entr", "default") is Verdict.CPU_FALLBACK
    assert judge.follow("aten::special_entr", "default") is None
    assert judge.follow("aten::_logcumsumexp", "default") is None  # a CPU kernel of its own: the bottom
    assert judge.follow("aten::as_strided", "default") is None  # the release registers it
    # CUDA only: neither the release nor the host can run it.
    assert judge.verdict("aten::_fused_dropout", "default") is Verdict.NO_KERNEL and Verdict.NO_KERNEL.bad
    assert judge.verdict("aten::_fused_dropout", "default", sparse=True) is Verdict.ERROR
    assert "fails on the NPU" in judge.hint("aten::_fused_dropout", "default", Verdict.NO_KERNEL)


def test_numbers_a_kernel_passes_for_tensors_are_wrapped() -> None:
    func = torch.ops.aten.bitwise_left_shift.Tensor
    x = torch.arange(4, dtype=torch.int32)
    args, kwargs = wrap_numbers(func, (x, 2), {})
    assert args[0] is x and args[1].dim() == 0 and args[1].dtype == torch.int32 and not kwargs
    assert torch.equal(func(*args), torch.tensor([0, 4, 8, 12], dtype=torch.int32))
    args, _ = wrap_numbers(torch.ops.aten.mul.Tensor, (x, 0.5), {})
    assert args[1].dtype == torch.get_default_dtype()  # as a Python float promotes an int tensor
    same = (x, x)
    assert wrap_numbers(func, same, {}) == (same, {})
