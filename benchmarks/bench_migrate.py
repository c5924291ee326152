"""Runtime migration overhead: a CUDA-style loop migrated to the CPU against the same loop written for it.

Usage::

    python benchmarks/bench_migrate.py [--rounds 7] [--steps 300]

Runs ``migrate_loop.py --style cuda`` under ``npu-migrate run --device cpu`` and
``migrate_loop.py --style cpu`` with plain python, alternating, each in a fresh process with one
thread, and prints the median per-step time of each and the median of the per-round ratios
(goal: <= 1.03).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

LOOP = Path(__file__).with_name("migrate_loop.py")


def run(cmd: list[str]) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])["median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="Runs of each loop (default: %(default)s).")
    parser.add_argument("--steps", type=int, default=300, help="Timed steps per run (default: %(default)s).")
    args = parser.parse_args()
    commands = {
        "migrated CUDA loop": [sys.executable, "-m", "npu_migrate", "run", "--device", "cpu", str(LOOP),
                               "--style", "cuda", "--steps", str(args.steps)],
        "CPU loop": [sys.executable, str(LOOP), "--style", "cpu", "--steps", str(args.steps)],
    }
    results: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(args.rounds):
        order = list(commands) if i % 2 == 0 else list(reversed(commands))
        for name in order:
            results[name].append(run(commands[name]))
    for name, values in results.items():
        print(f"{name:<20} median step {statistics.median(values) * 1e3:.3f} ms "
              f"(runs: {', '.join(f'{v * 1e3:.3f}' for v in values)})")
    ratios = [a / b for a, b in zip(results["migrated CUDA loop"], results["CPU loop"])]
    print(f"per-step ratio migrated / CPU: median {statistics.median(ratios):.3f} "
          f"(per round: {', '.join(f'{r:.3f}' for r in ratios)}); goal <= 1.03")


if __name__ == "__main__":
    main()
