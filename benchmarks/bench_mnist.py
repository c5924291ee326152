"""MNIST-shaped training throughput: examples/mnist.py against seed 000's pipeline, DDP against all_reduce, 2 ranks against 1.

Usage::

    python benchmarks/bench_mnist.py [--rounds 2] [--epochs 4] [--scaling-only]

The data are scikit-learn's digits at 28x28 (examples/mnist.py's ``--dataset digits``: 1438
training images), written once as MNIST's idx files in torchvision's layout in a temporary
directory, so the example (``--dataset mnist --data-dir DIR``) and the baseline
(benchmarks/mnist_seed000.py: torchvision's MNIST with per-sample PIL ``ToTensor``/``Normalize``
and one loader worker, as seed 000 writes it) read the same files. Same model (seed 002's CNN),
optimizer and batch size (32 per process).

Every configuration runs through ``python -m npu_migrate.launch`` on CPU, the configurations
alternate in each round, and a run's figure is the median samples/s (all ranks together) of its
epochs after the first. Printed: the median over rounds of each configuration, and the ratios
example/baseline (goal >= 2), DDP/all_reduce and 2 ranks/1 rank. Before that, the input
pipelines alone (one process, no model) are timed the same alternating way.

The ceiling for 2 ranks against 1 is what the cores give with no communication at all: as many
independent 1-rank jobs as there are cores, each with 1 thread, run at once (their samples/s
added), against the 1-rank job (which may use every core's thread). Goal: 2 ranks / 1 rank
>= 0.85 of that ceiling, and >= 1.0x. These three run next to each other in every round, and
their ratios are taken within each round (then the median over rounds), so that a change in the
machine's load between rounds does not enter them; ``--scaling-only`` runs just these, and the
2-rank DDP run once more without ``--cpu-binding``.

Every launcher run but that one passes ``--cpu-binding`` (on CPU: each rank on its own share of
the cores, its threads with it). Unbound, a rank's threads (its main thread, gloo's loop) run on
either core, and every time one of them takes the other rank's core both ranks wait at the next
all-reduce: the lockstep of DDP turns one rank's lost time into the job's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mnist.py"
BASELINE = Path(__file__).with_name("mnist_seed000.py")
sys.path.insert(0, str(ROOT / "examples"))

import common  # noqa: E402
import mnist  # noqa: E402


def write_idx(path: Path, array: np.ndarray) -> None:
    """One file of MNIST's idx format: magic, sizes (big-endian int32), then uint8 data."""
    path.write_bytes(struct.pack(f">{1 + array.ndim}i", 0x0800 + array.ndim, *array.shape) + array.tobytes())


def write_digits_as_mnist(root: Path) -> int:
    """The 28x28 digits as root/MNIST/raw/*-ubyte; returns the number of training images."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    train, test = mnist.load_digits()
    for prefix, data in (("train", train), ("t10k", test)):
        images, labels = data.tensors
        pixels = ((images * mnist.STD + mnist.MEAN) * 255).round().clamp(0, 255).squeeze(1)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", pixels.numpy().astype(np.uint8))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels.numpy().astype(np.uint8))
    return len(train)


# --------------------------------------------------------------------------- pipelines alone


def pipeline_rates(data_dir: Path, batch_size: int, rounds: int) -> dict[str, float]:
    """Samples/s of iterating one epoch of each training loader, no model, one process."""
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    seed_set = datasets.MNIST(str(data_dir), train=True, transform=transform)
    seed_loader = DataLoader(seed_set, sampler=DistributedSampler(seed_set, num_replicas=1, rank=0),
                             batch_size=batch_size, num_workers=1)
    raw = datasets.MNIST(str(data_dir), train=True)
    ours = mnist.mnist_tensors(raw.data, raw.targets)
    our_loader = DataLoader(ours, sampler=DistributedSampler(ours, num_replicas=1, rank=0), batch_size=batch_size,
                            collate_fn=common._whole_batch)
    rates: dict[str, list[float]] = {"example": [], "seed 000": []}
    for epoch in range(rounds + 1):
        for name, loader in (("example", our_loader), ("seed 000", seed_loader)):
            loader.sampler.set_epoch(epoch)
            start = time.perf_counter()
            seen = sum(len(target) for _, target in loader)
            if epoch:  # the first pass warms up
                rates[name].append(seen / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


# --------------------------------------------------------------------------- training runs


def run(config: str, data_dir: Path, epochs: int, work: Path) -> float:
    """One launcher run of a configuration; the median samples/s of its epochs after the first."""
    if config == CEILING:
        return ceiling(data_dir, epochs, work)
    out = work / f"{config}-{time.monotonic_ns()}.jsonl"
    nproc = "1" if config == "example, 1 rank" else "2"
    launch = [sys.executable, "-m", "npu_migrate.launch", "--device-num", nproc]
    if config != UNBOUND:
        launch.append("--cpu-binding")  # on CPU: each rank on its own share of the cores (issue 39)
    if config == "seed 000 baseline":
        cmd = [*launch, str(BASELINE), "--data-dir", str(data_dir), "--epochs", str(epochs), "--out", str(out)]
    else:
        sync = "allreduce" if config == "example, all_reduce" else "ddp"  # "example, DDP[, unbound]"
        cmd = [*launch, str(EXAMPLE), "--dataset", "mnist", "--data-dir", str(data_dir), "--epochs", str(epochs),
               "--grad-sync", sync, "--metrics", str(out)]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    result = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"error: {config} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return statistics.median(r["samples_per_sec"] for r in rows[1:])


def ceiling(data_dir: Path, epochs: int, work: Path) -> float:
    """Independent 1-thread, 1-rank jobs, one per core, all at once: their samples/s added."""
    procs, outs = [], []
    for i in range(os.cpu_count() or 1):
        outs.append(work / f"ceiling{i}-{time.monotonic_ns()}.jsonl")
        cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", "1", str(EXAMPLE), "--dataset", "mnist",
               "--data-dir", str(data_dir), "--epochs", str(epochs), "--grad-sync", "ddp", "--metrics", str(outs[-1])]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"error: the ceiling's 1-rank job failed ({proc.returncode}):\n{err[-2000:]}")
    total = 0.0
    for out in outs:
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        total += statistics.median(r["samples_per_sec"] for r in rows[1:])
    return total


CEILING = "ceiling, 1-thread 1-rank jobs on every core"
UNBOUND = "example, DDP, unbound"
# The three of the scaling figure run next to each other (in both orders), so that the machine's load
# changes as little as possible between them.
CONFIGS = ["seed 000 baseline", "example, all_reduce", "example, DDP", CEILING, "example, 1 rank", UNBOUND]
SCALING = ["example, DDP", CEILING, "example, 1 rank", UNBOUND]


def pipeline_figures(work: Path) -> None:
    """The input pipelines alone, printed."""
    pipes = pipeline_rates(work / "data", 32, rounds=3)
    print(f"input pipeline alone, 1 process: example {pipes['example']:,.0f} samples/s, seed 000 "
          f"{pipes['seed 000']:,.0f} samples/s, ratio {pipes['example'] / pipes['seed 000']:.1f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each configuration (default: %(default)s).")
    parser.add_argument("--epochs", type=int, default=4,
                        help="Epochs per run; the first is not counted (default: %(default)s).")
    parser.add_argument("--scaling-only", action="store_true",
                        help="Run only the configurations of the 2-ranks-vs-1 figure (DDP, 1 rank, the ceiling).")
    args = parser.parse_args()
    configs = SCALING if args.scaling_only else CONFIGS
    if args.epochs < 2:
        parser.error(f"--epochs {args.epochs}: pass 2 or more (the first epoch is a warm-up).")

    with tempfile.TemporaryDirectory(prefix="bench_mnist_") as tmp:
        work = Path(tmp)
        n_train = write_digits_as_mnist(work / "data")
        print(f"data: {n_train} digits at 28x28 in torchvision's MNIST layout; batch 32 per process; "
              f"{os.cpu_count()} CPU core(s); torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}",
              flush=True)
        if not args.scaling_only:
            pipeline_figures(work)

        figures: dict[str, list[float]] = {c: [] for c in configs}
        for round_ in range(args.rounds):
            order = configs if round_ % 2 == 0 else configs[::-1]
            for config in order:
                figures[config].append(run(config, work / "data", args.epochs, work))
                print(f"  round {round_ + 1}: {config:<44} {figures[config][-1]:8,.0f} samples/s", flush=True)

    med = {c: statistics.median(v) for c, v in figures.items()}
    print(f"\ntraining throughput, CPU, median over rounds (samples/s, all ranks together); load average now "
          f"{os.getloadavg()[0]:.2f}:")
    for config in configs:
        print(f"  {config:<44} {med[config]:8,.0f}")
    if not args.scaling_only:
        print(f"example / seed 000 baseline (2 ranks): {med['example, DDP'] / med['seed 000 baseline']:.2f}x (goal >= 2)")
        print(f"DDP / manual all_reduce (2 ranks):     {med['example, DDP'] / med['example, all_reduce']:.2f}x")
    # Ratios within each round, then their median: a round's three runs follow each other, so a change
    # of load between rounds moves them together.
    one = figures["example, 1 rank"]
    two_vs_one = statistics.median(d / o for d, o in zip(figures["example, DDP"], one))
    ceiling_ratio = statistics.median(c / o for c, o in zip(figures[CEILING], one))
    of_ceiling = statistics.median(d / c for d, c in zip(figures["example, DDP"], figures[CEILING]))
    unbound = statistics.median(u / c for u, c in zip(figures[UNBOUND], figures[CEILING]))
    print(f"2 ranks / 1 rank (example, DDP):       {two_vs_one:.2f}x; ceiling (no communication) "
          f"{ceiling_ratio:.2f}x; {of_ceiling:.2f} of the ceiling (goal >= 0.85 and >= 1.0x; medians of the "
          f"rounds' ratios); without --cpu-binding {unbound:.2f} of the ceiling")


if __name__ == "__main__":
    main()
