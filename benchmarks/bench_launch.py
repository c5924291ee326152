"""Launcher start-up: npu_migrate.launch against torchrun on the same 2-rank job.

Usage::

    python benchmarks/bench_launch.py [--rounds 9] [--nproc 2]

Runs ``allreduce_job.py`` (join a gloo group, all-reduce once; then again with an Adam step, as
training scripts do) under
``python -m npu_migrate.launch --device-num N`` and ``python -m torch.distributed.run
--nproc-per-node N``, alternating, and prints the median wall time of each, their ratio (goal:
<= 0.8) and where the time goes: when rank 0's script started, when torch was imported in it,
when the group was joined, and when the launcher had exited.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

JOB = Path(__file__).with_name("allreduce_job.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def commands(nproc: int) -> dict[str, list[str]]:
    return {
        "npu_migrate.launch": [sys.executable, "-m", "npu_migrate.launch", "--device-num", str(nproc), str(JOB)],
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                     "--master-port", "{port}", str(JOB)],
    }


def run_once(cmd: list[str], optimizer: bool = False) -> dict[str, float]:
    cmd = [part.replace("{port}", str(free_port())) for part in cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", BENCH_OPTIMIZER="1" if optimizer else "0")
    env["BENCH_T0"] = repr(time.time())
    t0 = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    if result.returncode != 0:
        raise SystemExit(f"{cmd[2]} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    marks = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    return {"wall": wall, **marks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="Runs of each launcher (default: %(default)s).")
    parser.add_argument("--nproc", type=int, default=2, help="Ranks (default: %(default)s).")
    args = parser.parse_args()

    import_torch = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        import_torch.append(time.perf_counter() - t0)

    cmds = commands(args.nproc)
    run_once(cmds["npu_migrate.launch"])  # warm the page cache for both
    run_once(cmds["torchrun"])
    for optimizer in (False, True):
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in cmds}
        for i in range(args.rounds):
            order = list(cmds) if i % 2 == 0 else list(reversed(cmds))  # alternate who goes first
            for name in order:
                runs[name].append(run_once(cmds[name], optimizer))
        report(runs, args, optimizer, statistics.median(import_torch))


def report(runs: dict[str, list[dict[str, float]]], args: argparse.Namespace, optimizer: bool, import_s: float) -> None:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    job = "join + all-reduce + build and step Adam" if optimizer else "join + all-reduce (the issue's job)"
    print(f"\n{args.nproc}-rank gloo job: {job}; {args.rounds} alternating runs each, medians in seconds "
          f"(python -c 'import torch' alone: {import_s:.2f} s)")
    print(f"{'launcher':<20} {'script start':>12} {'torch imported':>14} {'joined':>8} {'all-reduced':>11} "
          f"{'optimizer':>9} {'wall':>7}")
    for name in runs:
        print(f"{name:<20} {med(name, 'script_start'):>12.2f} {med(name, 'torch_imported'):>14.2f} "
              f"{med(name, 'joined'):>8.2f} {med(name, 'all_reduced'):>11.2f} {med(name, 'optimizer_ready'):>9.2f} "
              f"{med(name, 'wall'):>7.2f}")
    ratios = [a["wall"] / b["wall"] for a, b in zip(runs["npu_migrate.launch"], runs["torchrun"])]
    print(f"wall-time ratio npu_migrate.launch / torchrun: median {statistics.median(ratios):.2f} "
          f"(per round: {', '.join(f'{r:.2f}' for r in ratios)}); goal <= 0.80")


if __name__ == "__main__":
    main()
