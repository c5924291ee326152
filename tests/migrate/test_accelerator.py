"""Scripts of today under runtime migration: ``torch.accelerator``, FSDP2, DTensor and distributed checkpoints.

Real processes on 2 CPU ranks (gloo) and on the simulated NPU (tests/fake_npu), on every torch
that has the API; the rest skip, naming what torch lacks. Also: a job that met no CUDA call says
so, simulated devices report a current GPU's capability, and ported guards hold on CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, ROOT, child_env, run_cli
from support import Launch, needs_accelerator, needs_fsdp2, reports

SCRIPTS = Path(__file__).with_name("scripts")
@needs_accelerator
def test_accelerator_answers_user_code_and_torch_keeps_the_truth() -> None:
    from npu_migrate import migrate

    with migrate.enabled(device="cpu", device_count=2):
        acc = torch.accelerator
        assert acc.is_available() and acc.device_count() == 2
        assert acc.current_accelerator() == torch.device("cuda")
        acc.set_device_index(1)
        assert acc.current_device_index() == 1
        if hasattr(acc, "device_index"):  # torch >= 2.8; 2.6 and 2.7 have no such context manager
            with acc.device_index(0):
                assert acc.current_device_index() == 0
            assert acc.current_device_index() == 1
        with pytest.raises(migrate.MigrationError, match=r"set_device\(2\) but the script sees 2 simulated"):
            acc.set_device_index(2)
        acc.synchronize()
        assert acc.memory.memory_allocated() == 0 if hasattr(acc, "memory") else True
        namespace: dict = {"torch": torch}
        # Code whose file lies inside torch asks the same and gets torch's answer (no GPU here).
        exec(compile("answer = torch.accelerator.is_available()", torch.__file__, "exec"), namespace)
        assert namespace["answer"] is False
        model = torch.nn.Linear(4, 4).to(torch.device(f"{acc.current_accelerator()}:1"))
        optimizer = torch.optim.Adam(model.parameters())  # torch's Adam asks torch.accelerator too
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        if hasattr(acc, "Graph"):
            with pytest.raises(migrate.MigrationError, match=r"torch\.accelerator\.Graph has no cpu equivalent"):
                acc.Graph()


@needs_accelerator
def test_every_public_accelerator_callable_has_a_cpu_answer() -> None:
    from npu_migrate.migrate.patches.accelerator import ACCELERATOR_TABLE, ADVICE, public_callables

    missing = sorted(set(public_callables()) - set(ACCELERATOR_TABLE) - set(ADVICE))
    assert not missing, f"torch.accelerator callables with no row in ACCELERATOR_TABLE: {missing}"


@pytest.mark.slow
@needs_accelerator
@pytest.mark.parametrize("paths", [(), (FAKE_NPU,)], ids=["cpu", "fake_npu"])
def test_accelerator_ddp_amp_script_trains_on_two_ranks(tmp_path: Path, paths: tuple) -> None:
    if paths:
        from conftest import FAKE_NPU_MISSING

        if FAKE_NPU_MISSING:
            pytest.skip(FAKE_NPU_MISSING)
    report = tmp_path / "report.json"
    job = Launch(tmp_path, "--migrate", "--migrate-report", str(report), "--device-num", "2",
                 str(SCRIPTS / "accelerator_ddp.py"), paths=paths, **({"ASCEND_RT_VISIBLE_DEVICES": "0,1"} if paths else {}))
    assert job.wait(240) == 0, job.err
    got = reports(tmp_path, 2)
    family, backend = ("npu", "hccl") if paths else ("cuda", "gloo")
    for rank, r in enumerate(got):
        assert (r["backend"], r["device"], r["count"], r["current"]) == (backend, f"{family}:{rank}", 2, rank)
        assert r["last_loss"] < r["first_loss"]
    assert got[0]["params"] == got[1]["params"]  # DDP kept the ranks in step
    apis = json.loads(report.read_text())["apis"]
    assert apis["torch.accelerator.device_count"]["first_site"].endswith("accelerator_ddp.py:18")
    if not paths:
        assert apis["get_default_backend_for_device(cuda)"]["count"] == 2
        assert apis['torch.autocast(device_type="cuda")']["count"] == 20


@pytest.mark.slow
@needs_fsdp2
def test_fsdp2_dtensor_and_distributed_checkpoint_on_two_cpu_ranks(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    job = Launch(tmp_path, "--migrate", "--migrate-report", str(report), "--device-num", "2",
                 str(SCRIPTS / "accelerator_fsdp2.py"))
    assert job.wait(300) == 0, job.err
    got = reports(tmp_path, 2)
    for r in got:
        assert (r["world"], r["backend"], r["mesh_device"], r["param_device"]) == (2, "gloo", "cpu", "cpu")
        assert r["dtensor"] and r["reloaded_equal"] and r["last_loss"] < r["first_loss"]
    assert got[0]["full"] == got[1]["full"]  # one model, sharded over both ranks
    assert (tmp_path / "dcp" / ".metadata").exists()
    apis = json.loads(report.read_text())["apis"]
    for api in ('init_device_mesh("cuda")', "Module.to_empty(device=)", "torch.accelerator.current_accelerator"):
        assert apis[api]["processes"] == 2, api


@pytest.mark.slow
@needs_fsdp2
@pytest.mark.fake_npu
@pytest.mark.xfail(strict=True, reason="the simulated NPU (tests/fake_npu) cannot run DTensor, with or without "
                   "migration: detach of a sharded parameter recurses in its PrivateUse1 kernel (RecursionError "
                   "in sharding propagation of aten.detach)")
def test_fsdp2_on_the_simulated_npu(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--migrate", "--device-num", "2", str(SCRIPTS / "accelerator_fsdp2.py"), paths=(FAKE_NPU,),
                 ASCEND_RT_VISIBLE_DEVICES="0,1")
    assert job.wait(300) == 0, job.err
    assert all(r["mesh_device"] == "npu" and r["reloaded_equal"] for r in reports(tmp_path, 2))


@pytest.mark.slow
def test_meta_and_cuda_device_contexts(tmp_path: Path) -> None:
    script = tmp_path / "ctx.py"
    script.write_text("import torch\nwith torch.device('meta'):\n    a = torch.nn.Linear(2, 2)\n"
                      "with torch.device('cuda:1'):\n    b = torch.nn.Linear(2, 2)\n"
                      "print(a.weight.device, b.weight.device)\n")
    result = run_cli("run", "--device-num", "2", str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["meta", "cpu"]


@pytest.mark.slow
def test_a_job_that_meets_no_cuda_call_says_so(tmp_path: Path) -> None:
    script = tmp_path / "gated.py"
    script.write_text("import sys, torch\nif not hasattr(torch, 'npu_nonexistent'):\n"
                      "    print('Unable to locate sufficient 2 gpus to run this example. Exiting.')\n    sys.exit()\n")
    warning = "migration saw no CUDA or accelerator call: did the script stop at a device check?"
    run = run_cli("run", str(script))
    assert run.returncode == 0 and f"npu-migrate run: warning: {warning}" in run.stderr
    report = tmp_path / "report.md"
    job = Launch(tmp_path, "--migrate", "--migrate-report", str(report), "--device-num", "2", str(script))
    assert job.wait(120) == 0, job.err
    assert f"0 unmapped; warning: {warning}" in job.err
    assert f"**Warning: {warning}**" in report.read_text()
    quiet = Launch(tmp_path, "--migrate", "--device-num", "2", str(SCRIPTS / "cuda_torchrun.py"), name="quiet")
    assert quiet.wait(120) == 0, quiet.err
    assert "warning" not in quiet.err  # a job that met CUDA calls and wrote no report says nothing more


@pytest.mark.slow
def test_simulated_devices_report_a_current_gpus_capability(tmp_path: Path) -> None:
    script = tmp_path / "gate.py"
    script.write_text(
        "import sys, torch\n"
        "if torch.cuda.get_device_capability() < (7, 0):\n"
        "    print('Exiting because torch.compile is not supported on this device.')\n    sys.exit()\n"
        "p = torch.cuda.get_device_properties(0)\n"
        "print('compiled path', p.major, p.minor)\n")
    report = tmp_path / "report.json"
    result = run_cli("run", "--migrate-report", str(report), str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "compiled path 8 0"
    note = json.loads(report.read_text())["apis"]["torch.cuda.get_device_capability"]["detail"]
    assert note == "(8, 0) on cpu, an A100's: capability gates take their current-GPU path"


@pytest.mark.slow
def test_ported_guard_holds_with_two_cpu_ranks(tmp_path: Path) -> None:
    """``assert local_rank < torch.cuda.device_count()``, ported, on 2 CPU ranks without --migrate."""
    ported = tmp_path / "ported"
    result = run_cli("port", str(SCRIPTS / "guarded_torchrun.py"), "--out", str(ported))
    assert result.returncode == 0, result.stderr
    script = ported / "guarded_torchrun.py"
    text = script.read_text()
    assert "nm.device_count()" in text and "torch.cuda" not in text
    out = tmp_path / "out"
    out.mkdir()
    job = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", str(script)],
                         env=child_env(OUT_DIR=str(out)), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert job.returncode == 0, job.stderr
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["device_count"]) for r in got] == [(0, 2), (1, 2)]
    assert got[0]["params"] == got[1]["params"]


def test_device_count_on_cpu_outside_a_job_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import npu_migrate as nm

    assert nm.device_count() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert nm.device_count() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")
    assert nm.device_count() == 1
