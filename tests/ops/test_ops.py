"""``npu-migrate ops``: real models with known operator sets, judged against the real torch-npu wheels.

The wheels come from ``NPU_MIGRATE_RELEASES_DIR`` or, where it is unset, ``.ci-cache/torch-npu-releases``
(CI caches them there, as for the real-package tier); a test whose wheel is missing skips, saying so.
Each audit runs in this process through ``npu_migrate.cli.main``, as the console command does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from ops.conftest import registers

from npu_migrate.cli import main
from npu_migrate.ops.cli import REFIRE_S, time_limit
from npu_migrate.ops.record import AuditDone

SCRIPTS = Path(__file__).with_name("scripts")


def audit(tmp_path: Path, script: str, *extra: str, release: str | None = None,
          args: tuple[str, ...] = ()) -> tuple[int, dict]:
    out = tmp_path / "ops.json"
    argv = ["ops", *(["--torch-npu", release] if release else []), "--json", str(out), *extra,
            str(SCRIPTS / script), *args]
    code = main(argv)
    return code, json.loads(out.read_text())


def ops_named(data: dict, op: str) -> list[dict]:
    return [o for o in data["ops"] if o["op"] == op]


def test_entr_falls_back_on_both_releases(tmp_path: Path, release: str, capsys: pytest.CaptureFixture) -> None:
    code, data = audit(tmp_path, "entr_train.py", release=release)
    assert code == 1
    assert data["torch_npu"] == release and data["steps"] == 2 and data["verdict"] == "cpu_fallback"
    (entr,) = ops_named(data, "aten::special_entr")
    assert entr["verdict"] == "cpu_fallback" and entr["overload"] == "default"
    assert entr["count"] == 2 and entr["per_step"] == 1.0 and entr["dtypes"] == ["float32"]
    assert entr["phase"] == "forward" and entr["site"].endswith("entr_train.py:11")
    assert entr["function"] == "torch.special.entr"
    assert {o["op"] for o in data["ops"] if o["verdict"] == "cpu_fallback"} == {"aten::special_entr"}
    shown = capsys.readouterr().out
    assert "| `aten::special_entr.default` | cpu_fallback | 1 | float32 | forward |" in shown


def test_transformer_fast_path_falls_back(tmp_path: Path, release: str) -> None:
    code, data = audit(tmp_path, "transformer_eval.py", release=release)
    assert code == 1
    assert data["steps"] == 0 and data["ended"] == "the script ended"
    (fast,) = ops_named(data, "aten::_transformer_encoder_layer_fwd")
    assert fast["verdict"] == "cpu_fallback" and fast["count"] == 3 and fast["site"].endswith("transformer_eval.py:10")
    assert "set_fastpath_enabled(False)" in fast["hint"]


def test_sdpa_is_native_and_its_cpu_decomposition_is_not_reported(tmp_path: Path, release: str) -> None:
    code, data = audit(tmp_path, "sdpa_train.py", release=release)
    assert code == 0, [o for o in data["ops"] if o["verdict"] == "cpu_fallback"]
    assert data["verdict"] == "npu" and data["summary"]["cpu_fallback"] == 0
    (sdpa,) = ops_named(data, "aten::scaled_dot_product_attention")
    assert sdpa["verdict"] == "npu" and sdpa["count"] == 2 and sdpa["site"].endswith("sdpa_train.py:17")
    # torch's CPU pieces (flash-for-cpu on 2.14, the math path on 2.1) and their backward are not the NPU's.
    assert not [o for o in data["ops"] if "scaled_dot_product" in o["op"] and o["op"] != sdpa["op"]]
    assert not [o for o in data["ops"] if o["site"].endswith("sdpa_train.py:17") and o["op"] != sdpa["op"]]


def test_sdpa_inside_multihead_attention_is_the_releases(tmp_path: Path, release: str) -> None:
    """torch 2.1's CPU flash kernel (_scaled_dot_product_flash_attention) was reported as a host fallback."""
    code, data = audit(tmp_path, "mha_sdpa_train.py", release=release)
    assert not [o for o in data["ops"] if o["op"].startswith("aten::_scaled_dot_product")]
    sites = {o["site"].rpartition(":")[2]: o for o in ops_named(data, "aten::scaled_dot_product_attention")}
    assert sites["13"]["verdict"] == "npu" and sites["13"]["per_step"] == 1.0
    assert code == (1 if data["summary"]["cpu_fallback"] else 0)


def test_fused_optimizers_are_judged_by_their_fused_kernel(tmp_path: Path, every_release: str) -> None:
    """Where torch has no CPU fused kernel (< 2.4), the CPU runs the optimizer unfused; the NPU calls the
    fused kernel all the same. A release lacking ``_fused_adam_`` (2.1.0.post17, 2.6.0.post5: read from
    the wheel) runs it on the host where torch has a CPU kernel, and nowhere (no_kernel) where not."""
    release = every_release
    code, data = audit(tmp_path, "fused_adam_train.py", "--steps", "4", release=release)
    (adamw,) = ops_named(data, "aten::_fused_adamw_")
    assert adamw["verdict"] == "npu" and adamw["phase"] == "optimizer step"
    assert adamw["site"].endswith("fused_adam_train.py:13")
    (adam,) = ops_named(data, "aten::_fused_adam_")
    assert adam["site"].endswith("fused_adam_train.py:14") and adam["phase"] == "optimizer step"
    if registers(release, "_fused_adam_"):
        assert adam["verdict"] == "npu"
    elif torch.ops.aten._fused_adam_.default.has_kernel_for_dispatch_key(torch._C.DispatchKey.CPU):
        assert adam["verdict"] == "cpu_fallback"
    else:  # torch < 2.4: nothing on the NPU host runs it
        assert adam["verdict"] == "no_kernel" and code == 1 and data["verdict"] == "no_kernel"
        assert "fused=False (foreach) or torch_npu.optim's NpuFused class" in adam["hint"]


def test_float64_training_is_flagged(tmp_path: Path, release: str, capsys: pytest.CaptureFixture) -> None:
    code, data = audit(tmp_path, "float64_train.py", release=release)
    assert data["steps"] == 2
    risky = data["risks"]["float64"]
    assert risky and all(r["dtypes"] == ["float64"] for r in risky)
    assert any(r["op"] == "aten::addmm" and r["site"].endswith("float64_train.py:11") for r in risky)
    assert "float64/complex tensors on the device" in capsys.readouterr().out
    assert code == (1 if data["summary"]["cpu_fallback"] else 0)


def test_item_every_step_is_a_counted_sync(tmp_path: Path, release: str) -> None:
    code, data = audit(tmp_path, "item_train.py", release=release)
    assert code == 0 and data["steps"] == 2
    (sync,) = data["risks"]["syncs"]
    assert sync == {"what": "aten::_local_scalar_dense", "count": 2, "per_step": 1.0,
                    "site": sync["site"]} and sync["site"].endswith("item_train.py:15")
    # loss.backward() makes the loss's implicit gradient (ones_like) before the engine runs: backward too.
    assert {o["phase"] for o in data["ops"] if o["site"].endswith("item_train.py:14")} == {"backward"}


def test_moves_to_a_tensors_device_are_not_host_copies(tmp_path: Path, release: str) -> None:
    """clip_grad_norm_'s norm.to(first_device) and x.to(y.device) read "cpu" here, the NPU there."""
    _, data = audit(tmp_path, "device_of_tensor_train.py", release=release)
    assert data["steps"] == 2
    (sync,) = data["risks"]["syncs"]
    assert (sync["what"], sync["per_step"]) == ("Tensor.to(cpu)", 1.0)
    assert sync["site"].endswith("device_of_tensor_train.py:18")
    # torch.zeros(..., device=x.device) is made on the device, by the NPU.
    (zeros,) = ops_named(data, "aten::zeros")
    assert zeros["site"].endswith("device_of_tensor_train.py:13") and zeros["per_step"] == 1.0


def test_host_data_is_not_counted(tmp_path: Path, release: str) -> None:
    """entr_train.py draws its batches on the host: torch.rand is not a device operator."""
    _, data = audit(tmp_path, "entr_train.py", release=release)
    assert not ops_named(data, "aten::uniform_") and not ops_named(data, "aten::rand")


def test_mp_spawn_ddp_script_runs_as_one_rank(tmp_path: Path, release: str) -> None:
    code, data = audit(tmp_path, "spawn_ddp.py", release=release, args=(str(tmp_path / "ranks"),))
    assert code == 0 and data["steps"] == 2
    assert (tmp_path / "ranks").read_text() == "0/1\n"  # the script wrote rank/world
    assert not ops_named(data, "aten::special_entr")


def test_the_one_ranks_port_is_held_while_the_script_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Picked, not taken by another connection before the script's rank 0 serves it, then given back."""
    from npu_migrate.launch.setup import ports
    from npu_migrate.ops.cli import one_rank

    monkeypatch.delenv("MASTER_PORT", raising=False)
    with one_rank():
        port = int(os.environ["MASTER_PORT"])
        assert port in ports.held()
    assert port not in ports.held() and "MASTER_PORT" not in os.environ
    monkeypatch.setenv("MASTER_PORT", "29999")  # the user's own is kept, and nothing is held
    held = ports.held()
    with one_rank():
        assert os.environ["MASTER_PORT"] == "29999" and ports.held() == held


def test_cuda_only_imports_are_listed(tmp_path: Path, release: str, capsys: pytest.CaptureFixture,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from npu_migrate.libs.table import LIBRARIES, SHIM_NOTE

    for name in [m for m in sys.modules if m.split(".")[0] in ("apex", "flash_attn", "bitsandbytes")]:
        monkeypatch.delitem(sys.modules, name)  # imported afresh, as in a new process
    code, data = audit(tmp_path, "cuda_only.py", release=release)
    assert code == 1
    names = {f["name"]: f for f in data["cuda_only"]}
    assert set(names) == {"apex", "flash_attn", "bitsandbytes"}
    assert names["apex"]["site"].endswith("cuda_only.py:5") and names["flash_attn"]["site"].endswith("cuda_only.py:8")
    # npu_migrate.libs serves flash_attn and apex under runtime migration: their imports work. Each
    # row's advice is the table's (npu_migrate/libs/table.py), with the shim noted where one is served.
    for served in ("apex", "flash_attn"):
        assert names[served]["error"] == ""
        assert names[served]["advice"] == LIBRARIES[served].advice + SHIM_NOTE
    assert names["bitsandbytes"]["error"].startswith("ModuleNotFoundError")
    assert names["bitsandbytes"]["advice"] == LIBRARIES["bitsandbytes"].advice
    captured = capsys.readouterr()
    assert "## CUDA-only code" in captured.out
    assert "npu-migrate ops: the script failed: ModuleNotFoundError" in captured.err


@pytest.mark.long
def test_steps_end_the_script_after_torch_compile(tmp_path: Path, release: str,
                                                   capsys: pytest.CaptureFixture) -> None:
    code, data = audit(tmp_path, "compiled_train.py", release=release)
    assert (code, data["steps"], data["ended"]) == (1, 2, "ended after --steps 2")
    assert "ran all 50 steps" not in capsys.readouterr().out
    assert [o["verdict"] for o in ops_named(data, "aten::special_entr")] == ["cpu_fallback"]


def test_seconds_ends_an_inference_loop(tmp_path: Path, release: str) -> None:
    code, data = audit(tmp_path, "forever.py", "--seconds", "2", release=release)
    assert data["ended"] == "--seconds 2 reached" and data["steps"] == 0
    assert code == 0 and data["summary"]["cpu_fallback"] == 0  # what it recorded depends on the machine's speed


def test_seconds_fires_again_after_a_firing_that_was_dropped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An AuditDone raised inside a weakref callback is dropped by Python (an audit of a `while
    True` loop once ran for good that way, once in 56 runs under load); the limit fires
    again, and the dropped one is not printed. A plain op list: the limit needs no release (a
    GPU host's torch has none cached)."""
    listing = tmp_path / "ops.txt"
    listing.write_text("aten::add.Tensor\n")
    code, data = audit(tmp_path, "limit_in_a_callback.py", "--op-list", str(listing), "--seconds", "1000")
    assert (code, data["ended"]) == (0, "--seconds 1000 reached")
    assert "Exception ignored" not in capsys.readouterr().err


def test_seconds_gives_the_callers_timer_back() -> None:
    """In-process (an API caller, pytest-timeout's signal method): the caller's SIGALRM handler and
    real-time timer are back after the audit's own, the timer with the time it had left."""
    def outer(signum: int, frame: object) -> None:
        raise AssertionError("the caller's timer fired before it was due")

    saved_handler = signal.signal(signal.SIGALRM, outer)
    saved_timer = signal.setitimer(signal.ITIMER_REAL, 1000)
    try:
        with time_limit(5):
            assert signal.getsignal(signal.SIGALRM) is not outer
            assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 5
        assert signal.getsignal(signal.SIGALRM) is outer
        assert 5 < signal.getitimer(signal.ITIMER_REAL)[0] <= 1000
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, saved_handler)
        if saved_timer[0]:
            signal.setitimer(signal.ITIMER_REAL, *saved_timer)


def test_seconds_never_stops_the_script_inside_an_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expiring while a module is imported, the limit lets the import finish and stops the script
    after it: a module stopped half-way keeps what it registered (torch's operators) and fails the
    next import of it ("Tried to register an operator ... multiple times", a flake seen in-process)."""
    (tmp_path / "limit_inside_import.py").write_text(
        "import signal\nsignal.raise_signal(signal.SIGALRM)  # the limit expires here\nFINISHED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "limit_inside_import", raising=False)
    with pytest.raises(AuditDone, match="--seconds 1000 reached"), time_limit(1000):
        import limit_inside_import  # noqa: F401
        assert sys.modules["limit_inside_import"].FINISHED
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= REFIRE_S  # firing again, soon
        signal.pause()  # the limit, after the import: AuditDone
    assert sys.modules["limit_inside_import"].FINISHED


def test_markdown_file(tmp_path: Path, release: str) -> None:
    target = tmp_path / "ops.md"
    code, data = audit(tmp_path, "entr_train.py", "--markdown", str(target), release=release)
    text = target.read_text()
    assert text.startswith(f"# Operator audit: ") and f"torch-npu {release}" in text
    assert "**Verdict: cpu_fallback**" in text and "aten::special_entr" in text


def test_default_release_is_the_one_made_for_this_torch(tmp_path: Path, release: str) -> None:
    """No --torch-npu and no torch_npu installed: the cached release whose METADATA requires this torch."""
    import torch

    from npu_migrate import releases

    code, data = audit(tmp_path, "item_train.py")
    wanted = ".".join(torch.__version__.split(".")[:2])
    chosen = releases.find(data["torch_npu"], allow_download=False)
    assert data["torch_npu"].startswith(wanted + ".") and wanted in (chosen.requires_torch or "")
    assert code == 0


def test_meta_records_the_same_operators_without_memory(tmp_path: Path, release: str) -> None:
    """--meta: the device's tensors are meta tensors; the same operators, plus the host-to-device copies."""
    def seen(data: dict) -> set:
        return {(o["op"], o["overload"], o["verdict"], o["phase"], o["count"], tuple(o["dtypes"]), o["site"])
                for o in data["ops"]}

    code, real = audit(tmp_path, "float64_train.py", release=release)
    meta_code, fake = audit(tmp_path, "float64_train.py", "--meta", release=release)
    assert (meta_code, fake["steps"]) == (code, 2)
    extra = seen(fake) - seen(real)
    assert {(op, phase) for op, _, _, phase, *_ in extra} == {("aten::_to_copy", "other")}  # x.cuda(): a real copy
    assert not seen(real) - seen(fake)
    # model.to(device, dtype=...) kept its dtype: the same float64 risks, and the copy's.
    assert [r for r in fake["risks"]["float64"] if r["op"] != "aten::_to_copy"] == real["risks"]["float64"]


def test_meta_host_reads_get_zeros_and_count(tmp_path: Path, release: str) -> None:
    code, data = audit(tmp_path, "item_train.py", "--meta", release=release)
    assert code == 0 and data["steps"] == 2
    (sync,) = data["risks"]["syncs"]
    assert (sync["what"], sync["per_step"]) == ("Tensor.item", 1.0) and sync["site"].endswith("item_train.py:15")


def test_operator_lists_of_both_releases(release: str) -> None:
    """What the wheel's YAML says, read with pyyaml and with the reader used where pyyaml is missing."""
    import yaml

    from npu_migrate import releases
    from npu_migrate.releases import operators

    text = releases.find(release, allow_download=False).read_text(operators.OPERATORS_YAML)
    with_yaml = yaml.safe_load(text)
    by_hand = operators.read_codegen_yaml(text)
    for section in ("supported", "symint", "quant", "autograd", "custom"):
        names = [operators.entry_name(e) for e in with_yaml.get(section) or []]
        assert [operators.entry_name(e) for e in by_hand.get(section) or []] == names, section
    listing = operators.of_release(releases.find(release, allow_download=False))
    assert listing.release == release and listing.requires_torch.startswith("torch==" + release[:3])
    assert len(with_yaml["supported"]) <= len(listing.aten)  # 1080 in 2.14.0, 1075 in 2.1.0.post17, plus symint...
    assert listing.registers("aten::add", "Tensor") and listing.registers("aten::scaled_dot_product_attention", "default")
    assert not listing.registers("aten::special_entr", "default") and not listing.registers("aten::special_entr", "out")
    assert listing.registers("npu::npu_format_cast", "default") and "npu_format_cast" in listing.custom


def test_op_list_plain_file(tmp_path: Path) -> None:
    """Only what the list names is registered: everything else the step needs falls back."""
    listing = tmp_path / "ops.txt"
    listing.write_text("# my release\naten::addmm\naten::special_entr.default\n")
    code, data = audit(tmp_path, "entr_train.py", "--op-list", str(listing))
    assert data["torch_npu"] == str(listing) and data["op_list"] == "file"
    assert ops_named(data, "aten::special_entr")[0]["verdict"] == "npu"
    assert ops_named(data, "aten::addmm")[0]["verdict"] == "npu"
    assert ops_named(data, "aten::sigmoid")[0]["verdict"] == "cpu_fallback" and code == 1


@pytest.mark.parametrize("argv, message", [
    (["ops", "missing.py"], "script 'missing.py' not found"),
    (["ops", "--steps", "0", "x.py"], "--steps 0 is not positive"),
    (["ops", "--seconds", "-1", "x.py"], "--seconds -1 is not positive"),
    (["ops", "--op-list", "/nonexistent/ops.txt", str(SCRIPTS / "item_train.py")], "--op-list '/nonexistent/ops.txt' cannot be read"),
    (["ops", "--json", "/nonexistent/dir/o.json", str(SCRIPTS / "item_train.py")], "folder /nonexistent/dir does not exist"),
])
def test_usage_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_unreachable_release_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("NPU_MIGRATE_RELEASES_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the index is unreachable
    assert main(["ops", "--torch-npu", "2.14.0", str(SCRIPTS / "item_train.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cannot get torch-npu 2.14.0" in err and str(tmp_path / "empty") in err
