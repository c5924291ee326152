"""Training on the simulated NPU: tensors on npu:i, hccl collectives, DDP, AMP, checkpoints.

tests/fake_npu's torch_npu makes npu tensors CPU-backed (see its docstring). One real 2-process
job (tests/launch/scripts/fake_npu_job.py) runs every check on npu:{local_rank} and compares with the
same computation on CPU; the DDP result is compared here with training done in this process,
which has no stand-in, so a collective that did not really average fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import FAKE_NPU, LAUNCH_SCRIPTS, child_env, run_cli, run_ranks

pytestmark = [pytest.mark.fake_npu, pytest.mark.slow]  # one simulated-NPU job (a module fixture) serves the tests

SEED, STEPS, WORLD = 3, 5, 2


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("fake_npu_job")
    reports = run_ranks(
        LAUNCH_SCRIPTS / "fake_npu_job.py", WORLD, out, FAKE_NPU, timeout=150,
        FAKE_NPU_SEED=str(SEED), FAKE_NPU_STEPS=str(STEPS),
    )
    return reports, out


# The same model and batches as tests/launch/scripts/fake_npu_job.py.
def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 1)
    )


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED * 1000 + rank * 100 + step)
    return torch.randn(4, 1, 6, 6, generator=gen), torch.randn(4, 1, generator=gen)


def cpu_training(ranks: list[int]) -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    """Adam on CPU, gradients averaged over ``ranks`` as DDP does: sum of grad * (1 / world)."""
    torch.manual_seed(SEED)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses: list[list[float]] = [[] for _ in ranks]
    for step in range(STEPS):
        grads = []
        for i, rank in enumerate(ranks):
            model.zero_grad(set_to_none=True)
            x, y = batch(rank, step)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses[i].append(loss.item())
            grads.append([p.grad * (1.0 / len(ranks)) for p in model.parameters()])
        for n, p in enumerate(model.parameters()):
            total = grads[0][n]
            for g in grads[1:]:
                total = total + g[n]
            p.grad = total
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def test_ops_on_npu_stay_there_and_equal_cpu_bitwise(job) -> None:
    reports, _ = job
    for rank, r in enumerate(reports):
        assert (r["device"], r["backend"]) == (f"npu:{rank}", "hccl")
        for name, check in r["tensors"]["checks"].items():
            assert check == {"device": f"npu:{rank}", "type": "NpuTensor", "dtype": check["dtype"],
                             "on_device": True, "equal": True}, name
        assert r["tensors"]["checks"]["argmax"]["dtype"] == "torch.int64"
        assert r["tensors"]["out_returns_same_object"] and r["tensors"]["inplace_returns_same_object"]


def test_factories_moves_and_host_access(job) -> None:
    reports, out = job
    for rank, r in enumerate(reports):
        t = r["tensors"]
        here = f"npu:{rank}"
        assert t["factories"] == {
            "zeros": here, "ones_default_index": here, "full": here, "arange": [0, 1, 2, 3],
            "tensor": here, "empty_like": here, "new_zeros": here, "tensor_npu": here, "is_npu": True,
        }
        assert (t["moved_device"], t["moved_equal"]) == (f"npu:{(rank + 2) % 8}", True)
        assert (t["cpu_type"], t["cpu_device"]) == ("Tensor", "cpu")
        assert t["item"] == 2.5
        assert t["tolist"] == t["expected_tolist"]
        assert t["str"] == t["expected_str"] and t["str"].startswith("tensor([[")
        assert t["str"] in (out / f"rank{rank}.log").read_text()  # print() wrote it
        assert t["seeded_randn_repeats"] and t["randn_device"] == here
        assert t["mixing"]["npu_and_cpu"].startswith(
            f"Expected all tensors to be on the same device, but found at least two devices, {here} and cpu!")
        assert f"{here} and npu:{(rank + 2) % 8}!" in t["mixing"]["two_npus"]
        assert t["scalar_mixing"]  # a 0-dim CPU tensor is a scalar, as on CUDA
        assert t["param_repr"] == f"Parameter containing:\ntensor([1., 1.], device='{here}', requires_grad=True)"


def test_hccl_collectives_on_npu_tensors_communicate(job) -> None:
    reports, _ = job
    for rank, r in enumerate(reports):
        c = r["collectives"]
        assert c["all_reduce_sum"] == [3.0, 3.0, 3.0] and c["all_reduce_device"] == f"npu:{rank}"
        assert c["all_reduce_max"] == [1.0, 0.0]
        assert c["broadcast"] == [0.0, 2.0, 4.0, 6.0] and c["broadcast_device"] == f"npu:{rank}"
        assert c["all_gather"] == [[0.0, 0.0], [1.0, 10.0]]
        assert c["all_gather_devices"] == [f"npu:{rank}"] * WORLD
        assert c["all_gather_single"] == [0.0, 0.0, 1.0, 10.0]
        assert c["async_all_reduce"] == [3.0, 3.0]
        assert c["all_gather_object"] == [{"rank": 0}, {"rank": 1}]


def test_ddp_adam_on_npu_equals_cpu_training(job) -> None:
    reports, out = job
    # Saved on npu, loaded here where there is no NPU at all.
    states = [torch.load(out / f"rank{r}.pt", map_location="cpu", weights_only=True) for r in range(WORLD)]
    expected, expected_losses = cpu_training(list(range(WORLD)))
    alone, _ = cpu_training([0])  # what rank 0 would reach if gradients were not averaged
    for rank, state in enumerate(states):
        assert reports[rank]["ddp"]["devices"] == [f"npu:{rank}"]  # params, grads, Adam state
        assert reports[rank]["ddp"]["restored_equal"]  # torch.load(map_location=npu) round trip
        assert reports[rank]["ddp"]["losses"] == expected_losses[rank]
        assert state.keys() == expected.keys()
        for key, value in state.items():
            assert value.device.type == "cpu" and type(value) is torch.Tensor
            assert torch.equal(value, states[0][key]), f"{key} differs between ranks"
            assert torch.equal(value, expected[key]), f"{key} differs from CPU training"
    assert any(not torch.equal(states[0][k], alone[k]) for k in alone)


def test_autocast_and_grad_scaler_on_npu(job) -> None:
    reports, _ = job
    for r in reports:
        amp = r["amp"]
        assert (amp["scaler_type"], amp["scaler_enabled"]) == ("GradScaler", True)
        assert amp["dtypes"] == [["torch.float16", "torch.float32"]]  # linear in fp16, mse_loss in fp32
        assert amp["stepped"] and amp["finite"]
        assert amp["overflow_skipped"] and amp["huge_scale_after"] == 2.0 ** 59


def test_device_api_events_streams_memory(job) -> None:
    reports, _ = job
    for rank, r in enumerate(reports):
        api = r["device_api"]
        assert api["memory_grew_by"] == 4 * 1024 * 1024 and api["peak"] >= 4 * 1024 * 1024
        assert api["memory_after_free"] < 1024
        assert api["stats_keys"] == ["allocated", "max_allocated", "max_reserved", "reserved"]
        # The events bracket a 50 ms sleep and lie inside the host clock's view of the same span.
        assert 50.0 <= api["elapsed_ms"] <= api["host_ms"]
        assert api["current_stream_device"] == f"npu:{rank}"
        assert api["stream_result"] == [2.0, 2.0]
        assert api["loaded_to_cpu"] == "cpu"


def test_smoke_command_trains_on_simulated_npu() -> None:
    result = run_cli("smoke", "--nproc", "2", "--steps", "10", env=child_env(FAKE_NPU))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("smoke: ok: 2 ranks on npu/hccl, "), result.stdout
