"""gloo on ranks bound to one CPU: the transport thread at nice 19 (``--cpu-binding``) against nice 0.

Usage::

    python benchmarks/bench_gloo_one_cpu.py [--rounds 5] [--calls 40]

Two ranks on two CPUs, one CPU each, run ``gloo_pause_job.py``: all-reduces of 4 B, 16 KB and 1.7 MB,
each after a 20 ms pause (asleep, as a step waiting on its data, then computing, as a step's
forward and backward) and a barrier. Two configurations alternate in every round:

* ``--cpu-binding``: the launcher binds each rank to its CPU, and :mod:`npu_migrate.launch.procs.gloo_io`
  lowers each gloo group's transport thread to nice 19;
* the baseline: the launcher binds nothing and each rank binds itself to the same CPU before
  importing torch, so every thread of it, gloo's transport thread too, runs at nice 0.

Prints each configuration's median call time per size and pause (median over rounds) and the ratio
baseline / ``--cpu-binding`` (the speed-up; the mechanism earns its keep where it is well above 1).
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

JOB = Path(__file__).with_name("gloo_pause_job.py")
SIZES = {"1": "4 B", "4096": "16 KB", "421642": "1.7 MB"}


def run(bound: bool, pause: str, cpus: list[int], calls: int, work: Path) -> dict:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", BENCH_PAUSE=pause,
               BENCH_CALLS=str(calls), BENCH_WARMUP="5")
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2"]
    if bound:
        cmd.append("--cpu-binding")
    else:
        env["BENCH_SELF_BIND"] = ",".join(map(str, cpus))
    proc = subprocess.run([*cmd, str(JOB)], env=env, cwd=work, capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: os.sched_setaffinity(0, set(cpus)))
    if proc.returncode != 0:
        raise SystemExit(f"error: the job failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.lstrip().endswith("}"))
    got = json.loads(line[line.index("{"):])
    expected = [0, 19] if bound else [0]
    if got["nice"] != expected:
        raise SystemExit(f"error: the ranks' threads ran at nice {got['nice']}, not {expected}")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit("error: needs 2 CPUs, one for each rank")
    cpus = allowed[:2]
    times: dict[tuple[str, bool], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for pause in ("sleep", "compute"):
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for bound in order:
                    times.setdefault((pause, bound), []).append(run(bound, pause, cpus, args.calls, Path(tmp)))
            print(f"  round {round_ + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    print(f"gloo all-reduce on 2 ranks bound to a CPU each ({cpus}), median ms per call after a 20 ms pause, "
          f"median of {args.rounds} rounds of {args.calls} calls; load average now {os.getloadavg()[0]:.2f}:")
    for pause in ("sleep", "compute"):
        for size, label in SIZES.items():
            fixed = statistics.median(r[size] for r in times[(pause, True)])
            base = statistics.median(r[size] for r in times[(pause, False)])
            ratios = [b[size] / f[size] for f, b in zip(times[(pause, True)], times[(pause, False)])]
            print(f"  after {pause:<7} {label:>6}: nice 0 {base:6.2f}  --cpu-binding (nice 19) {fixed:6.2f}  "
                  f"speed-up {statistics.median(ratios):5.2f}x")


if __name__ == "__main__":
    main()
