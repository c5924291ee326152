"""A rank of a training job on the simulated NPU (tests/fake_npu): tensors, collectives, DDP, AMP.

Run with torchrun's variables and FAKE_NPU_SEED/FAKE_NPU_STEPS set (tests/conftest.run_ranks);
writes $OUT_DIR/rank{RANK}.json with what it saw and $OUT_DIR/rank{RANK}.pt with the DDP model's
state_dict. Every check compares with the same computation on CPU tensors in this process; the
DDP result is compared by the test with training done without the stand-in.
"""

import io
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import npu_migrate as nm

OUT = Path(os.environ["OUT_DIR"])
SEED = int(os.environ.get("FAKE_NPU_SEED", "0"))
STEPS = int(os.environ.get("FAKE_NPU_STEPS", "5"))


def make_model() -> torch.nn.Module:
    """A tiny CNN; the test builds the same one."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 1)
    )


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of one rank at one step; the test builds the same ones."""
    gen = torch.Generator().manual_seed(SEED * 1000 + rank * 100 + step)
    return torch.randn(4, 1, 6, 6, generator=gen), torch.randn(4, 1, generator=gen)


def same(npu_value: torch.Tensor, cpu_value: torch.Tensor, device: torch.device) -> dict:
    """Where an npu result lives and whether it equals the CPU result bit for bit."""
    return {
        "device": str(npu_value.device),
        "type": type(npu_value).__name__,
        "dtype": str(npu_value.dtype),
        "on_device": npu_value.device == device,
        "equal": bool(torch.equal(npu_value.cpu(), cpu_value)),
    }


def tensor_checks(device: torch.device, rank: int) -> dict:
    other = torch.device("npu", (rank + 2) % torch.npu.device_count())
    gen = torch.Generator().manual_seed(123)
    a_cpu, b_cpu = torch.randn(5, 7, generator=gen), torch.randn(7, 3, generator=gen)
    img_cpu, w_cpu = torch.randn(2, 1, 6, 6, generator=gen), torch.randn(3, 1, 3, 3, generator=gen)
    a, b, img, w = a_cpu.to(device), b_cpu.to(device), img_cpu.to(device), w_cpu.to(device)

    view_cpu, view = a_cpu.clone(), a.clone()
    view_cpu[1:3, ::2].fill_(7.0)  # writing through a view changes the base
    view[1:3, ::2].fill_(7.0)
    out_cpu, out = torch.empty(5, 7), torch.empty(5, 7, device=device)
    torch.add(a_cpu, 1.5, out=out_cpu)
    returned = torch.add(a, 1.5, out=out)
    inplace = a.clone()
    inplace_result = inplace.mul_(2).add_(1)
    idx = torch.tensor([0, 3], device=device)

    checks = {
        "matmul": same(a @ b, a_cpu @ b_cpu, device),
        "softmax": same(a.softmax(-1), a_cpu.softmax(-1), device),
        "sum_mean_max": same(torch.stack([a.sum(), a.mean(), a.max()]), torch.stack([a_cpu.sum(), a_cpu.mean(), a_cpu.max()]), device),
        "argmax": same(a.argmax(1), a_cpu.argmax(1), device),
        "conv2d": same(F.conv2d(img, w), F.conv2d(img_cpu, w_cpu), device),
        "index": same(a[idx], a_cpu[torch.tensor([0, 3])], device),
        "where_cat": same(torch.cat([torch.where(a > 0, a, b.sum()), a]), torch.cat([torch.where(a_cpu > 0, a_cpu, b_cpu.sum()), a_cpu]), device),
        "view_write_through": same(view, view_cpu, device),
        "out_arg": same(out, out_cpu, device),
        "inplace": same(inplace, a_cpu * 2 + 1, device),
        "grad": None,
    }
    x = a.clone().requires_grad_()
    (x.sin() * b.sum()).sum().backward()
    x_cpu = a_cpu.clone().requires_grad_()
    (x_cpu.sin() * b_cpu.sum()).sum().backward()
    checks["grad"] = same(x.grad, x_cpu.grad, device)

    mixing = {}
    for name, fn in (("npu_and_cpu", lambda: a + a_cpu), ("two_npus", lambda: a + a.to(other))):
        try:
            fn()
            mixing[name] = "no error"
        except RuntimeError as exc:
            mixing[name] = str(exc)
    param_repr = repr(torch.nn.Parameter(torch.ones(2, device=device)))
    moved = a.to(other)
    scalar = torch.tensor(2.5, device=device)
    text = str(a[:2, :3])
    print(a[:2, :3], flush=True)
    torch.manual_seed(SEED)
    r1 = torch.randn(4, device=device)
    torch.manual_seed(SEED)
    r2 = torch.randn(4, device=device)
    return {
        "checks": checks,
        "out_returns_same_object": returned is out,
        "inplace_returns_same_object": inplace_result is inplace,
        "factories": {
            "zeros": str(torch.zeros(2, 3, device=device).device),
            "ones_default_index": str(torch.ones(2, device="npu").device),
            "full": str(torch.full((2,), 3.0, device=device).device),
            "arange": torch.arange(4, device=device).tolist(),
            "tensor": str(torch.tensor([1, 2], device=device).device),
            "empty_like": str(torch.empty_like(a).device),
            "new_zeros": str(a.new_zeros(3).device),
            "tensor_npu": str(torch.ones(2).npu().device),
            "is_npu": a.is_npu,
        },
        "mixing": mixing,
        "scalar_mixing": (a + torch.tensor(1.0)).device == device,
        "param_repr": param_repr,
        "moved_device": str(moved.device),
        "moved_equal": bool(torch.equal(moved.cpu(), a_cpu)),
        "cpu_type": type(a.cpu()).__name__,
        "cpu_device": str(a.cpu().device),
        "item": scalar.item(),
        "tolist": a[0, :3].tolist(),
        "expected_tolist": a_cpu[0, :3].tolist(),
        "str": text,
        "expected_str": str(a_cpu[:2, :3])[:-1] + f", device='{device}')",
        "seeded_randn_repeats": bool(torch.equal(r1.cpu(), r2.cpu())),
        "randn_device": str(r1.device),
    }


def collective_checks(device: torch.device, rank: int, world: int) -> dict:
    summed = torch.full((3,), float(rank + 1), device=device)
    dist.all_reduce(summed)
    biggest = torch.tensor([float(rank), -float(rank)], device=device)
    dist.all_reduce(biggest, op=dist.ReduceOp.MAX)
    sent = torch.arange(4, dtype=torch.float32, device=device) * (rank + 1)
    dist.broadcast(sent, src=world - 1)
    parts = [torch.empty(2, device=device) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([float(rank), 10.0 * rank], device=device))
    flat = torch.empty(2 * world, device=device)
    # all_gather_single is the newer name (torch >= 2.14); all_gather_into_tensor the older one.
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather_single(flat, torch.tensor([float(rank), 10.0 * rank], device=device))
    pending = torch.full((2,), 2.0 ** rank, device=device)
    work = dist.all_reduce(pending, async_op=True)
    work.wait()
    dist.barrier()
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    return {
        "all_reduce_sum": summed.tolist(),
        "all_reduce_device": str(summed.device),
        "all_reduce_max": biggest.tolist(),
        "broadcast": sent.tolist(),
        "broadcast_device": str(sent.device),
        "all_gather": [p.tolist() for p in parts],
        "all_gather_devices": [str(p.device) for p in parts],
        "all_gather_single": flat.tolist(),
        "async_all_reduce": pending.tolist(),
        "all_gather_object": objects,
    }


def train_ddp(info: nm.DistInfo) -> dict:
    torch.manual_seed(SEED)
    model = make_model().to(info.device)
    ddp = DDP(model, device_ids=info.device_ids)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        x, y = batch(info.rank, step)
        loss = F.mse_loss(ddp(x.to(info.device)), y.to(info.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    devices = sorted({str(p.device) for p in model.parameters()} | {str(p.grad.device) for p in model.parameters()})
    devices += sorted({str(v.device) for s in optimizer.state.values() for v in s.values() if v.dim() > 0})
    torch.save(model.state_dict(), OUT / f"rank{info.rank}.pt")
    # Resume as a training script would: load the checkpoint straight onto this rank's device.
    restored = make_model().to(info.device)
    restored.load_state_dict(torch.load(OUT / f"rank{info.rank}.pt", map_location=info.device, weights_only=True))
    restored_equal = all(
        p.device == info.device and torch.equal(p.cpu(), q.cpu())
        for p, q in zip(restored.parameters(), model.parameters())
    )
    return {"losses": losses, "devices": sorted(set(devices)), "restored_equal": restored_equal}


def amp_checks(info: nm.DistInfo) -> dict:
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(info.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = nm.grad_scaler(init_scale=2.0 ** 10)
    before = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(SEED)
    dtypes = set()
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=gen).to(info.device), torch.randn(16, 1, generator=gen).to(info.device)
        with nm.autocast():
            out = model(x)
            loss = F.mse_loss(out, y)
        dtypes.add((str(out.dtype), str(loss.dtype)))
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    stepped = any(not torch.equal(a.cpu(), b.cpu()) for a, b in zip(before, model.parameters()))

    # A scale so large that the float16 backward overflows: the step must be skipped, the scale cut.
    huge = nm.grad_scaler(init_scale=2.0 ** 60)
    frozen = [p.detach().clone() for p in model.parameters()]
    with nm.autocast():
        loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    huge.scale(loss).backward()
    huge.step(optimizer)
    huge.update()
    skipped = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(frozen, model.parameters()))
    return {
        "scaler_type": type(scaler).__name__,
        "scaler_enabled": scaler.is_enabled(),
        "dtypes": sorted(dtypes),
        "stepped": stepped,
        "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
        "overflow_skipped": skipped,
        "huge_scale_after": huge.get_scale(),
    }


def device_api_checks(info: nm.DistInfo) -> dict:
    nm.reset_peak_memory_stats()
    before = nm.memory_allocated()
    block = torch.empty(1024, 1024, device=info.device)  # 4 MiB
    during = nm.memory_allocated()
    del block
    start, end = nm.Event(enable_timing=True), nm.Event(enable_timing=True)
    host_start = time.perf_counter()
    start.record()
    time.sleep(0.05)  # the work being timed: at least 50 ms
    end.record()
    nm.synchronize()
    host_ms = (time.perf_counter() - host_start) * 1000.0
    stream = nm.Stream()
    with nm.stream(stream):
        inside = torch.ones(2, device=info.device) * 2
    buffer = io.BytesIO()
    torch.save({"t": inside}, buffer)
    buffer.seek(0)
    return {
        "memory_grew_by": during - before,
        "memory_after_free": nm.memory_allocated() - before,
        "peak": nm.max_memory_allocated() - before,
        "stats_keys": sorted(nm.memory_stats() or {}),
        "elapsed_ms": start.elapsed_time(end),
        "host_ms": host_ms,
        "current_stream_device": str(nm.current_stream().device),
        "stream_result": inside.tolist(),
        "device_name": nm.device_name(),
        "loaded_to_cpu": str(torch.load(buffer, map_location="cpu", weights_only=True)["t"].device),
    }


info = nm.init_distributed()
report = {
    "rank": info.rank,
    "device": str(info.device),
    "backend": info.backend,
    "tensors": tensor_checks(info.device, info.rank),
    "collectives": collective_checks(info.device, info.rank, info.world_size),
    "ddp": train_ddp(info),
    "amp": amp_checks(info),
    "device_api": device_api_checks(info),
}
nm.destroy_distributed()
(OUT / f"rank{info.rank}.json").write_text(json.dumps(report))
