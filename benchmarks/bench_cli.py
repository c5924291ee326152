"""Command-line start-up: wall time and peak memory of npu-migrate's commands next to ``import torch``.

Usage::

    python benchmarks/bench_cli.py [--rounds 5]

Runs each command ``--rounds`` times, alternating between them so that a busy machine slows
them alike, and prints per command the median wall time, its peak resident memory (the
child's own, from ``wait4``), and both as ratios of ``python -c "import torch"``. Goal: the
commands that need no torch (``--help``, ``port --list-rules``, ``check``) under 0.5 s and
100 MB here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S, GOAL_MB = 0.5, 100.0


def commands(tree: Path) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "npu_migrate"]
    return {
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "npu-migrate --help": [*cli, "--help"],
        "npu-migrate port --list-rules": [*cli, "port", "--list-rules"],
        "npu-migrate check (1 file)": [*cli, "check", str(tree)],
        "npu-migrate env": [*cli, "env", "--device", "cpu"],
    }


def run_once(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS in MB of one run of ``cmd``."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # check exits 1 when it finds something to port
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
    return wall, usage.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Runs of each command (default: %(default)s).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "project"
        tree.mkdir()
        (tree / "train.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n")
        cmds = commands(tree)
        walls: dict[str, list[float]] = {name: [] for name in cmds}
        peaks: dict[str, float] = dict.fromkeys(cmds, 0.0)
        for name, cmd in cmds.items():  # warm the page cache once
            run_once(cmd)
        for _ in range(args.rounds):
            for name, cmd in cmds.items():
                wall, rss = run_once(cmd)
                walls[name].append(wall)
                peaks[name] = max(peaks[name], rss)
    base = next(iter(cmds))
    base_wall, base_rss = statistics.median(walls[base]), peaks[base]
    print(f"{'command':<32} {'median s':>9} {'peak MB':>8} {'x import torch (time, memory)':>30}  goal")
    for name in cmds:
        wall, rss = statistics.median(walls[name]), peaks[name]
        torch_free = name.startswith(("npu-migrate --help", "npu-migrate port", "npu-migrate check"))
        goal = ("met" if wall < GOAL_S and rss < GOAL_MB else "MISSED") if torch_free else ""
        print(f"{name:<32} {wall:>9.3f} {rss:>8.1f} {wall / base_wall:>17.2f} {rss / base_rss:>11.2f}  {goal}")
    print(f"\n{args.rounds} round(s), alternating; goal for the torch-free commands: < {GOAL_S} s and < {GOAL_MB:.0f} MB.")


if __name__ == "__main__":
    main()
