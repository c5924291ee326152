"""Probe and compare cost: MNIST step time with --probe and --probe-level modules against none; comparing two big recordings.

Usage::

    python benchmarks/bench_probe.py [--rounds 9] [--steps 20] [--compare-steps 10000] [--modules 100]

Part 1, one process, one thread: the MNIST example's network (``examples/mnist.py``'s
SimpleCNN, batch 32, Adadelta) trains on a fixed synthetic batch in blocks of ``--steps`` steps:
without a probe, with ``Probe(level="steps")`` (what ``--probe DIR`` records) and with
``Probe(level="modules")``, in rotating order, each probed block writing a fresh directory.
Prints the median per-step time of each and the medians of the per-round ratios against no
probe (goal: <= 1.2x for the step-level record).

Part 2: writes two recordings in the probe's format of ``--compare-steps`` steps of a chain of
``--modules`` linear layers (forward input and output, backward output and input gradients,
weight and bias gradients: 6 entries per module per step), B differing from A by noise well
within tolerance, then times ``npu_migrate.compare.compare(A, B)`` (reading both and judging
every entry; goal: under 10 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from npu_migrate.compare import Probe, records  # noqa: E402


def mnist_block(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = F.nll_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def bench_steps(rounds: int, steps: int) -> None:
    from mnist import SimpleCNN

    torch.manual_seed(0)
    model = SimpleCNN()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    x, y = torch.randn(32, 1, 28, 28), torch.randint(10, (32,))
    tmp = Path(tempfile.mkdtemp(prefix="bench_probe_"))
    load_before = os.getloadavg()[0]  # other work on the machine moves these figures: say how much there was
    times: dict[str, list[float]] = {"none": [], "steps": [], "modules": []}
    mnist_block(model, opt, x, y, 3)  # warm-up
    try:
        for r in range(rounds):
            kinds = list(times)
            kinds = kinds[r % 3:] + kinds[:r % 3]  # rotate the order so no kind always runs first
            for kind in kinds:
                if kind == "none":
                    times[kind].append(mnist_block(model, opt, x, y, steps))
                else:
                    with Probe(tmp / f"{kind}{r}", level=kind):
                        times[kind].append(mnist_block(model, opt, x, y, steps))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(times["none"])
    print(f"MNIST SimpleCNN, batch 32, CPU, 1 thread: {rounds} rounds x {steps} steps per kind; load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} core(s)")
    print(f"  no probe:               {base * 1e3:8.2f} ms/step")
    for kind, label in (("steps", "--probe (steps)"), ("modules", "--probe-level modules")):
        ratio = statistics.median(t / n for t, n in zip(times[kind], times["none"]))
        print(f"  {label:<23} {statistics.median(times[kind]) * 1e3:8.2f} ms/step   ratio {ratio:5.3f}x"
              + ("   (goal <= 1.2x)" if kind == "steps" else ""))


def write_recording(directory: Path, steps: int, modules: int, noise: float, seed: int) -> int:
    """A rank-0 recording in the probe's format; returns its size in bytes."""
    import numpy as np

    directory.mkdir(parents=True)
    entries = []
    for m in range(modules):
        name = f"layers.{m}"
        entries += [(name, 0, "forward", "input.0", "float32", (32, 256)), (name, 0, "forward", "output", "float32", (32, 256))]
    for m in reversed(range(modules)):
        name = f"layers.{m}"
        entries += [(name, 0, "backward", "grad_output", "float32", (32, 256)),
                    (name, 0, "backward", "grad.weight", "float32", (256, 256)),
                    (name, 0, "backward", "grad.bias", "float32", (256,)),
                    (name, 0, "backward", "grad_input.0", "float32", (32, 256))]
    base_rng = np.random.default_rng(0)  # the same "true" statistics for A and B
    noise_rng = np.random.default_rng(seed)
    n = len(entries)
    with open(directory / "rank0.jsonl", "w") as fh:
        fh.write(json.dumps({"kind": "header", "format": records.FORMAT, "rank": 0, "world_size": 1, "device": "cpu",
                             "default_dtype": "float32", "seed": 0, "versions": {}, "settings": {}}) + "\n")
        fh.write(json.dumps(records.layout_line(0, entries)) + "\n")
        for step in range(1, steps + 1):
            scale = base_rng.uniform(0.5, 2.0, n)
            stats = np.stack([-scale, scale, scale / 10, scale * 40, np.zeros(n), np.zeros(n)], axis=1)
            stats[:, :4] *= 1 + noise * noise_rng.standard_normal((n, 1))
            loss = 2.3 / step ** 0.1
            fh.write(json.dumps({"kind": "step", "step": step, "loss": loss * (1 + noise * noise_rng.standard_normal()),
                                 "grad_norm": 1.0, "lr": 0.1, "autocast": None}) + "\n")
            fh.write(json.dumps({"kind": "modules", "step": step, "layout": 0,  # compact, as the probe writes
                                 "stats": records.encode_stats(stats.astype("<f8").ravel().tolist())},
                                separators=(",", ":")) + "\n")
        fh.write(json.dumps({"kind": "end", "steps": steps, "level": "modules", "module_records": steps * n,
                             "unmatched": []}) + "\n")
    return (directory / "rank0.jsonl").stat().st_size


def bench_compare(steps: int, modules: int) -> None:
    from npu_migrate.compare.reading.verdict import compare

    tmp = Path(tempfile.mkdtemp(prefix="bench_compare_"))
    try:
        size = write_recording(tmp / "a", steps, modules, 0.0, 1)
        write_recording(tmp / "b", steps, modules, 1e-6, 2)  # float32-sized noise: within the defaults
        t0, c0 = time.perf_counter(), time.process_time()
        result = compare(str(tmp / "a"), str(tmp / "b"))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"compare: two recordings of {steps} steps x {modules} modules ({result.module_entries_compared:,} "
          f"entries compared, {size / 1e6:.0f} MB each): {seconds:.2f} s (goal < 10 s; {cpu:.2f} s of CPU); "
          f"passed={result.passed}, max rel {result.max_rel:.2g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="Blocks per kind; 0 skips part 1 (default: %(default)s).")
    parser.add_argument("--steps", type=int, default=20, help="Training steps per block (default: %(default)s).")
    parser.add_argument("--compare-steps", type=int, default=10_000,
                        help="Steps of each recording to compare; 0 skips part 2 (default: %(default)s).")
    parser.add_argument("--modules", type=int, default=100, help="Modules per step (default: %(default)s).")
    args = parser.parse_args()
    random.seed(0)
    torch.set_num_threads(1)
    if args.rounds:
        bench_steps(args.rounds, args.steps)
    if args.compare_steps:
        bench_compare(args.compare_steps, args.modules)


if __name__ == "__main__":
    main()
