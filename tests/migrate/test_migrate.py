"""Runtime migration: unmodified CUDA/NCCL scripts on CPU/gloo (and the simulated NPU), in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, ROOT, child_env, free_port, run_cli
from support import Launch, reports, snapshot

SCRIPTS = Path(__file__).with_name("scripts")


def test_switching_off_restores_every_patched_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate import migrate

    before = snapshot()
    env_before = dict(__import__("os").environ)
    with migrate.enabled(device="cpu", device_count=2, propagate=True) as target:
        assert target == "cpu" and migrate.is_installed()
        during = snapshot()
        changed = sum(before[o][k] != during[o].get(k) for o in before for k in before[o])
        assert changed > 50  # the table really was applied
        assert torch.cuda.device_count() == 2
    assert not migrate.is_installed()
    assert snapshot() == before  # identity of every attribute, added ones removed
    assert dict(__import__("os").environ) == env_before
    assert torch.cuda.is_available() is False and torch.cuda.device_count() == 0


def test_user_code_sees_devices_torch_sees_the_truth() -> None:
    from npu_migrate import migrate

    with migrate.enabled(device="cpu", device_count=3):
        assert torch.cuda.is_available() and torch.cuda.device_count() == 3
        torch.cuda.set_device(2)
        assert torch.cuda.current_device() == 2
        assert "simulated on cpu" in torch.cuda.get_device_name()
        namespace: dict = {"torch": torch}
        # Code whose file lies inside torch asks the same question and gets torch's answer.
        exec(compile("answer = (torch.cuda.is_available(), torch.cuda.device_count())", torch.__file__, "exec"), namespace)
        assert namespace["answer"] == (False, 0)
        with pytest.raises(Exception, match="simulated cuda device"):
            torch.cuda.set_device(3)


def test_only_devices_move(tmp_path: Path) -> None:
    from npu_migrate import migrate

    with migrate.enabled(device="cpu"):
        x = torch.ones(2, device="cuda:0")
        assert x.device.type == "cpu" and x.is_cuda  # "on the device" for the user's code
        assert torch.zeros(1).to("cuda").device.type == "cpu"
        assert torch.zeros(1).to(torch.device("cuda", 0)).device.type == "cpu"
        assert torch.nn.Linear(2, 2).cuda(0).weight.device.type == "cpu"
        assert torch.zeros(2).new_ones(3, device="cuda").device.type == "cpu"
        path = tmp_path / "runs" / "cuda_exp" / "model.pt"  # merely contains "cuda": untouched
        path.parent.mkdir(parents=True)
        torch.save({"cuda_version": "12.1", "w": x}, str(path))
        loaded = torch.load(str(path), map_location="cuda:0", weights_only=True)
        assert loaded["cuda_version"] == "12.1" and torch.equal(loaded["w"], x)
        with pytest.raises(RuntimeError):
            torch.zeros(1).to("cudafoo")  # not a device string: torch's own error, not ours


def test_cuda_amp_events_and_unmapped_calls() -> None:
    from npu_migrate import migrate
    from npu_migrate.migrate.report import REPORT

    REPORT.reset()
    with migrate.enabled(device="cpu"):
        a = torch.randn(4, 4, device="cuda")
        with torch.cuda.amp.autocast():
            assert (a @ a).dtype == torch.bfloat16
        with torch.autocast(device_type="cuda"):
            assert (a @ a).dtype == torch.bfloat16
        assert not torch.cuda.amp.GradScaler().is_enabled()
        if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            assert not torch.amp.GradScaler("cuda").is_enabled()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        assert start.elapsed_time(end) >= 0 and isinstance(start, torch.cuda.Event)
        with torch.cuda.stream(torch.cuda.Stream()):
            pass
        torch.cuda.nvtx.range_push("step")
        torch.cuda.nvtx.range_pop()
        with pytest.raises(migrate.MigrationError, match=r"torch\.cuda\.CUDAGraph has no cpu equivalent under runtime migration: CUDA graphs are an optimization"):
            torch.cuda.CUDAGraph()
        with pytest.raises(migrate.MigrationError, match=r"torch\.cuda\.utilization has no cpu equivalent"):
            torch.cuda.utilization()
    kinds = {api: e["kind"] for api, e in REPORT.entries.items()}
    assert kinds["torch.cuda.amp.autocast"] == "redirected" and kinds["torch.cuda.nvtx.range_push"] == "noop"
    assert kinds["torch.cuda.CUDAGraph"] == "unmapped" and kinds["torch.cuda.utilization"] == "unmapped"
    assert REPORT.entries["torch.cuda.Event"]["count"] == 2
    assert REPORT.entries["torch.cuda.Event"]["first_site"].startswith(__file__)


def test_every_call_of_a_step_is_counted_and_keeps_torchs_signature() -> None:
    """The per-step calls take the short paths (no device keyword, a bare no-op): each call is still
    counted, a call torch rejects still fails, and ``device=`` is still mapped."""
    from npu_migrate import migrate
    from npu_migrate.migrate.report import REPORT

    x = torch.ones(2)
    REPORT.reset()  # the counts of this test's calls alone
    with migrate.enabled(device="cpu"):
        for _ in range(3):
            assert x.to("cuda", non_blocking=True) is x
            assert torch.cuda.synchronize() is None
            assert torch.ones_like(x, memory_format=torch.preserve_format).device.type == "cpu"
            assert x.to(dtype=torch.float64, device="cuda").dtype == torch.float64
            assert x.cuda(non_blocking=True) is x and x.to("cuda:1") is x
            assert torch.randn(2, device="cuda").device.type == "cpu"
        with pytest.raises(TypeError):
            torch.cuda.synchronize(0, 1)
        counts = {api: e["count"] for api, e in REPORT.entries.items()}
        sites = {api: e["first_site"] for api, e in REPORT.entries.items()}
        kept_to = torch.Tensor.to
    assert counts["Tensor.to"] == 9 and counts["torch.cuda.synchronize"] == 4 and counts["Tensor.cuda"] == 3
    assert counts["torch.randn(device=)"] == 3
    for api in ("Tensor.to", "torch.cuda.synchronize", "Tensor.cuda", "torch.randn(device=)"):
        assert sites[api].startswith(__file__), api
    assert "torch.ones_like(device=)" not in counts
    # Nothing mapped outlives migration: its wrapper, kept and called afterwards, maps nothing.
    with pytest.raises(migrate.MigrationError, match="not installed"):
        kept_to(x, "cuda")


@pytest.mark.slow
def test_torchrun_style_script_under_the_launcher(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    job = Launch(tmp_path, "--migrate", "--migrate-report", str(report), "--device-num", "2",
                 str(SCRIPTS / "cuda_torchrun.py"))
    assert job.wait(120) == 0, job.err
    got = reports(tmp_path, 2)
    assert got[0]["params"] == got[1]["params"]
    for rank, r in enumerate(got):
        assert (r["backend"], r["cuda_available"], r["device_count"], r["current_device"]) == ("gloo", True, 2, rank)
        assert r["elapsed_ms_positive"] and r["cuda_version"] == "12.1" and r["memory_allocated"] == 0
    assert (tmp_path / "runs" / "cuda_exp" / "model.pt").exists()
    merged = json.loads(report.read_text())
    assert merged["processes"] == 2 and merged["targets"] == ["cpu"]
    apis = merged["apis"]
    assert apis["init_process_group(backend=)"]["count"] == 2
    assert apis["torch.cuda.set_device"]["first_site"].endswith("cuda_torchrun.py:18")
    assert apis["DataLoader(pin_memory=True)"]["kind"] == "noop"
    assert "migration report" in job.err and "0 unmapped" in job.err


@pytest.mark.slow
def test_migrated_cuda_script_matches_the_cpu_script_exactly(tmp_path: Path) -> None:
    cuda_dir, cpu_dir = tmp_path / "cuda", tmp_path / "cpu"
    cuda_dir.mkdir()
    cpu_dir.mkdir()
    migrated = Launch(cuda_dir, "--migrate", "--device-num", "2", str(SCRIPTS / "cuda_torchrun.py"))
    assert migrated.wait(120) == 0, migrated.err
    plain = Launch(cpu_dir, "--device-num", "2", str(SCRIPTS / "cpu_torchrun.py"))
    assert plain.wait(120) == 0, plain.err
    assert reports(cuda_dir, 2)[0]["params"] == reports(cpu_dir, 2)[0]["params"]  # bitwise


@pytest.mark.slow
def test_self_spawning_script_under_run(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "run", "--device-num", "2", str(SCRIPTS / "cuda_spawn.py"),
         "--world-size", "1", "--rank", "0", "--port", str(free_port()), "--out", str(tmp_path)],
        env=child_env(OUT_DIR=str(tmp_path)), cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr
    got = reports(tmp_path, 2)
    assert [r["rank"] for r in got] == [0, 1]
    assert all((r["world_size"], r["backend"], r["device_count"], r["seen"]) == (2, "gloo", 2, [0, 1, 2, 3]) for r in got)
    assert got[0]["params"] == got[1]["params"]
    workers = [json.loads(p.read_text()) for p in tmp_path.glob("worker-*.json")]
    assert len(workers) == 2 and all(w == {"cuda_available": True, "device_count": 2} for w in workers)


@pytest.mark.slow
def test_auto_import_reaches_python_subprocesses(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import npu_migrate.auto\n"
        "import subprocess, sys, torch\n"
        "x = torch.ones(3).cuda()\n"
        "child = subprocess.run([sys.executable, '-c', 'import torch; print(torch.cuda.is_available(), torch.zeros(1, device=\"cuda\").device)'],\n"
        "                       capture_output=True, text=True, check=True)\n"
        "print(x.device, torch.cuda.is_available(), child.stdout.strip())\n"
    )
    result = subprocess.run([sys.executable, str(script)], env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cpu True True cpu"


def test_unmapped_call_in_a_script_is_one_line(tmp_path: Path) -> None:
    script = tmp_path / "graphs.py"
    script.write_text("import torch\ng = torch.cuda.CUDAGraph()\n")
    result = run_cli("run", str(script))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "npu-migrate: error: torch.cuda.CUDAGraph has no cpu equivalent under runtime migration: CUDA graphs are "
        "an optimization: run without capture, or guard it with a device-type check."
    ]


@pytest.mark.slow
@pytest.mark.fake_npu
def test_cuda_names_of_the_environment_take_their_ascend_names(tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text("import os, torch\nprint(torch.cuda.device_count(), os.environ['ASCEND_RT_VISIBLE_DEVICES'], "
                      "os.environ['PYTORCH_NPU_ALLOC_CONF'])\n")
    env = child_env(FAKE_NPU, CUDA_VISIBLE_DEVICES="2,3", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    result = run_cli("run", str(script), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "2,3", "expandable_segments:True"]


@pytest.mark.fake_npu
def test_simulated_npu_runs_the_cuda_script_on_hccl(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--migrate", "--device-num", "2", str(SCRIPTS / "cuda_torchrun.py"), paths=(FAKE_NPU,),
                 ASCEND_RT_VISIBLE_DEVICES="0,1")
    assert job.wait(120) == 0, job.err
    got = reports(tmp_path, 2)
    assert got[0]["params"] == got[1]["params"]
    for rank, r in enumerate(got):
        assert (r["backend"], r["cuda_available"], r["device_count"], r["current_device"]) == ("hccl", True, 2, rank)
    assert "CUDA calls migrated to npu" in job.err


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_a_fused_optimizer_trains_on_the_cpu_simulation(name: str) -> None:
    # A CUDA script's `fused=True`: kept where torch has the CPU kernel (2.4 on), else the same
    # update unfused, said in the report; either way the script trains.
    from npu_migrate import migrate
    from npu_migrate.migrate.report import REPORT

    cls = getattr(torch.optim, name)
    with migrate.enabled(device="cpu"):
        model = torch.nn.Linear(4, 1).cuda()
        optimizer = cls((p for p in model.parameters()), lr=0.1, fused=True)  # a generator, as users pass
        x, y = torch.randn(16, 4, device="cuda"), torch.randn(16, 1, device="cuda")
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        entry = REPORT.entries.get(f"torch.optim.{name}(fused=True)")
    assert losses[-1] < losses[0]
    if torch.__version__ >= "2.4":  # noqa: SIM108 - both sides of the version split
        assert optimizer.defaults["fused"] is True and entry is None
    else:
        assert optimizer.defaults["fused"] is False and entry["kind"] == "noop"
        assert "runs unfused" in entry["detail"]
