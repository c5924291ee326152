"""Where a second rank's time goes on 2 CPU cores: a training step, synchronized four ways.

Usage::

    python benchmarks/bench_step_costs.py [--rounds 5] [--steps 220]

Two ranks through ``python -m npu_migrate.launch --device-num 2 --cpu-binding`` (a core and a
thread each) train the MNIST example's model (examples/mnist.py, seed 002's CNN, 421,642
parameters) on a fixed batch of 32 (``step_costs_job.py``), one configuration after another in
every round (their order reversed every other round):

* ``no communication``: each rank steps alone: the baseline, what the cores give;
* ``4-byte all-reduce``: one all-reduce of a scalar after each backward: the ranks wait for each
  other every step, and no gradient moves;
* ``gradients, one all-reduce``: the gradients as one 1.7 MB tensor, all-reduced after the backward;
* ``DDP``: DistributedDataParallel, as examples/mnist.py trains (two buckets, the first all-reduced
  during the backward).

A run's figure is the mean step time of its slower rank (in lockstep, the job's pace). Printed: each
configuration's median over rounds, and baseline / configuration, the share of the no-communication
pace each keeps (bench_mnist.py's ``of the ceiling`` figure is the DDP one, there against
independent jobs and over whole epochs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = Path(__file__).with_name("step_costs_job.py")
CONFIGS = {"none": "no communication", "scalar": "4-byte all-reduce", "flat": "gradients, one all-reduce",
           "ddp": "DDP"}


def run(sync: str, steps: int, work: Path) -> float:
    """One job: the mean step time (ms) of its slower rank."""
    out = Path(tempfile.mkdtemp(dir=work))
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", BENCH_SYNC=sync, BENCH_STEPS=str(steps), BENCH_OUT=str(out))
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", "--cpu-binding", str(JOB)]
    proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"error: the {CONFIGS[sync]} job failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text())["ms"] for r in range(2)]
    return max(statistics.mean(ms) for ms in ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Runs of each configuration (default: %(default)s).")
    parser.add_argument("--steps", type=int, default=220,
                        help="Steps per run; the first 20 are not counted (default: %(default)s).")
    args = parser.parse_args()
    if args.steps <= 20:
        parser.error(f"--steps {args.steps}: pass more than 20 (the first 20 are a warm-up).")
    figures: dict[str, list[float]] = {s: [] for s in CONFIGS}
    print(f"{os.cpu_count()} CPU core(s); load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_step_costs_") as tmp:
        for round_ in range(args.rounds):
            order = list(CONFIGS) if round_ % 2 == 0 else list(CONFIGS)[::-1]
            for sync in order:
                figures[sync].append(run(sync, args.steps, Path(tmp)))
                print(f"  round {round_ + 1}: {CONFIGS[sync]:<28} {figures[sync][-1]:6.2f} ms/step", flush=True)
    base = figures["none"]
    print(f"\nms per step (the slower rank's mean; median over {args.rounds} rounds), and the share of the "
          f"no-communication pace kept (median of the rounds' ratios); load average now {os.getloadavg()[0]:.2f}:")
    for sync, name in CONFIGS.items():
        kept = statistics.median(b / f for b, f in zip(base, figures[sync]))
        print(f"  {name:<28} {statistics.median(figures[sync]):6.2f} ms  {kept:.2f}")


if __name__ == "__main__":
    main()
