"""Throughput of ``npu-migrate port`` against libcst's bare parse speed, on the installed torchvision.

Usage::

    python benchmarks/bench_port.py            # -j 2, torchvision
    python benchmarks/bench_port.py -j 4 --root /path/to/tree

Both sides use the same number of processes and read the same files; the two are measured in one
run, alternating, ``--repeat`` times, and the medians are compared. "port" is the whole command
minus start-up: reading every file, porting with scope analysis on (libcst's ScopeProvider and
QualifiedNameProvider run on every file in which the text prefilter finds a candidate; the others
are only syntax-checked), writing the mirror tree. "port, every file parsed" turns the prefilter
off to show the cost of scope analysis and the transformer on every file.
Goal (issue 13): port <= 1.5x libcst's bare parse of the same files.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import libcst

from npu_migrate.port import cli as port_cli
from npu_migrate.port import rules


def _parse(path: str) -> int:
    libcst.parse_module(Path(path).read_bytes())
    return 1


def _bare_parse(files: list[Path], jobs: int) -> float:
    start = time.perf_counter()
    if jobs <= 1:
        for f in files:
            _parse(str(f))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(_parse, [str(f) for f in files], chunksize=1))
    return time.perf_counter() - start


def _port(root: Path, jobs: int) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        files = port_cli._collect([str(root)], Path(tmp, "out"))
        results = port_cli.port_paths(files, "npu_migrate", [], [], jobs=jobs)
        port_cli._write_out(files, results, Path(tmp, "out"))
        seconds = time.perf_counter() - start
    changed = sum(1 for r in results if r.status == "changed")
    analysed = sum(1 for r in results if r.status in ("changed", "unchanged") and (r.changes or r.findings))
    return seconds, changed, analysed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=1,
                        help="Processes on both sides; 1 runs both in this process, warm (default: %(default)s).")
    parser.add_argument("--full", action="store_true",
                        help="Also time the port with the prefilter off (every file parsed and analysed; slow).")
    parser.add_argument("--root", help="Tree to port (default: the installed torchvision package).")
    parser.add_argument("--repeat", type=int, default=3, help="Alternating rounds; medians are compared "
                        "(default: %(default)s).")
    args = parser.parse_args()
    if args.root:
        root = Path(args.root)
    else:
        spec = importlib.util.find_spec("torchvision")
        if spec is None or spec.origin is None:
            raise SystemExit("torchvision is not installed: pip install torchvision, or pass --root DIR.")
        root = Path(spec.origin).parent
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"tree: {root} ({len(files)} Python files, {mb:.2f} MB), -j {args.jobs}")

    if args.jobs <= 1:  # warm both sides up once (imports, compiled patterns), unmeasured
        _bare_parse(files[:5], 1)
        _port(root, 1)
    bares, ports = [], []
    for _ in range(args.repeat):  # alternate, so drift on a shared machine hits both sides alike
        bares.append(_bare_parse(files, args.jobs))
        seconds, changed, analysed = _port(root, args.jobs)
        ports.append(seconds)
    bare, port = statistics.median(bares), statistics.median(ports)
    full = None
    if args.full:
        every_trigger = tuple(r.triggers for r in rules.RULES)
        for rule in rules.RULES:  # prefilter off: "" is in every file
            object.__setattr__(rule, "triggers", ("",))
        from npu_migrate.port import _rules_for
        _rules_for.cache_clear()
        full, _, _ = _port(root, args.jobs)
        for rule, triggers in zip(rules.RULES, every_trigger):
            object.__setattr__(rule, "triggers", triggers)
        _rules_for.cache_clear()

    def row(name: str, seconds: float) -> str:
        return (f"{name:<28} {seconds:7.2f} s  {len(files) / seconds:8.1f} files/s  {mb / seconds:6.2f} MB/s"
                f"  {seconds / bare:5.2f}x bare parse")

    print(row("libcst.parse_module (bare)", bare))
    print(row("npu-migrate port", port) + f"  ({changed} files changed, {analysed} with changes or findings)")
    if full is not None:
        print(row("port, every file parsed", full))
    print(f"rounds: bare {', '.join(f'{b:.2f}' for b in bares)} s; port {', '.join(f'{p:.2f}' for p in ports)} s")
    print(f"ratio port / bare parse: {port / bare:.2f} (goal: <= 1.5)")


if __name__ == "__main__":
    main()
