"""A training script written the way users write them: DataLoader workers, a Pool, a subprocess.

Plain torch, no npu_migrate: torchrun's environment, ``init_process_group`` with the backend a user
picks (``--cuda``: ``nccl`` and ``.cuda()``, as an unmodified CUDA script under ``--migrate``).
Each rank reads its DistributedSampler shard for two epochs through a DataLoader with
``--workers`` processes (``--context`` default, fork, spawn or forkserver; ``--persistent``,
``--pin-memory``), maps a ``multiprocessing.Pool`` of its own, runs a ``subprocess``, optionally
``torch.multiprocessing.spawn``s two children (``--mp-spawn``), trains a small DDP model under
autocast, saves and loads a checkpoint (``weights_only=True``), all-reduces what it saw, and writes
OUT/workers{RANK}.json (OUT: ``--out`` or $OUT_DIR). An ``atexit`` handler writes OUT/atexit{RANK},
and a ``tempfile.TemporaryDirectory`` is left for the interpreter's exit to remove.

Started by torchrun (or the launcher) it reads RANK and LOCAL_RANK; with ``--self-spawn N`` it is an
mp.spawn-style script that starts N ranks itself; ``train(local_rank, argv)`` is the function
target of ``npu_migrate.launch.spawn``.
"""

import argparse
import atexit
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SAMPLES = 48


class Indices(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int):
        return i, torch.full((3,), float(i)), os.getpid()


def square(x: int) -> int:
    return x * x


def child(index: int, out_dir: str, rank: int) -> None:
    Path(out_dir, f"mpspawn{rank}-{index}").write_text(str(os.getpid()))


def train(local_rank: int, argv: list) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", default="default", choices=["default", "fork", "spawn", "forkserver"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--pin-memory", action="store_true")
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--mp-spawn", action="store_true")
    parser.add_argument("--self-spawn", type=int, default=0)
    parser.add_argument("--out", default=os.environ.get("OUT_DIR"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    rank = int(os.environ["RANK"])
    atexit.register(lambda: Path(out, f"atexit{rank}").write_text("ran"))
    scratch = tempfile.TemporaryDirectory()  # removed at exit by its finalizer, as Python does
    if args.cuda:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        device = torch.device("cuda", local_rank)
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    start_method = multiprocessing.get_start_method()  # what the script finds, before anything sets it
    ctx = None if args.context == "default" else multiprocessing.get_context(args.context)
    sampler = DistributedSampler(Indices(), shuffle=True, seed=7)
    loader = DataLoader(Indices(), batch_size=4, sampler=sampler, num_workers=args.workers,
                        multiprocessing_context=ctx, persistent_workers=args.persistent,
                        pin_memory=args.pin_memory)
    epochs, shards, loader_pids = [], [], set()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
        seen = []
        for index, values, pids in loader:
            assert torch.equal(values[:, 0], index.float())
            seen += index.tolist()
            loader_pids.update(pids.tolist())
        epochs.append(seen)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(3, 1).to(device), device_ids=[local_rank] if args.cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _, values, _ in loader:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = model(values.to(device)).float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checkpoint = Path(scratch.name, "model.pt")
    torch.save(model.module.state_dict(), checkpoint)
    restored = torch.load(checkpoint, weights_only=True)
    assert torch.equal(restored["weight"].cpu(), model.module.weight.detach().cpu())
    total = torch.tensor([float(sum(epochs[0]))], device=device)
    dist.all_reduce(total)
    with multiprocessing.Pool(2) as pool:
        squares = pool.map(square, range(6))
    echoed = subprocess.run([sys.executable, "-c", "import os; print(os.environ['RANK'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if args.mp_spawn:
        torch.multiprocessing.spawn(child, args=(str(out), rank), nprocs=2)
    Path(out, f"workers{rank}.json").write_text(json.dumps({
        "rank": rank, "world_size": dist.get_world_size(), "epochs": epochs, "shards": shards,
        "total": total.item(), "start_method": start_method, "process": multiprocessing.current_process().name,
        "loader_pids": sorted(loader_pids), "pid": os.getpid(), "squares": squares, "echoed": echoed,
        "scratch": scratch.name,
    }))
    dist.destroy_process_group()


def self_spawned(local_rank: int, argv: list, nprocs: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nprocs))
    train(local_rank, argv)


if __name__ == "__main__":
    argv = sys.argv[1:]
    nprocs = int(argv[argv.index("--self-spawn") + 1]) if "--self-spawn" in argv else 0
    if nprocs:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", os.environ.get("WORKERS_JOB_PORT", "29533"))
        torch.multiprocessing.spawn(self_spawned, args=(argv, nprocs), nprocs=nprocs)
    else:
        train(int(os.environ["LOCAL_RANK"]), argv)
