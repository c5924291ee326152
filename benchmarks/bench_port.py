"""Throughput of ``npu-migrate port`` against libcst's bare parse speed, on the installed torchvision.

Usage::

    python benchmarks/bench_port.py            # -j 2, torchvision
    python benchmarks/bench_port.py -j 4 --root /path/to/tree

Both sides use the same number of processes. "port" is the whole command minus start-up: reading
every file, porting (files that contain no text any rule looks for are only syntax-checked, not
parsed by libcst), writing the mirror tree. "port, every file parsed" turns that prefilter off to
show the cost of the transformer itself. Goal: port within 2x of bare parsing.
"""

from __future__ import annotations

import argparse
import importlib.util
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
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(_parse, [str(f) for f in files], chunksize=max(1, len(files) // (jobs * 8))))
    return time.perf_counter() - start


def _port(root: Path, jobs: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        files = port_cli._collect([str(root)], Path(tmp, "out"))
        results = port_cli.port_paths(files, "npu_migrate", [], [], jobs=jobs)
        port_cli._write_out(files, results, Path(tmp, "out"))
        return time.perf_counter() - start, sum(1 for r in results if r.status == "changed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=2, help="Processes on both sides (default: %(default)s).")
    parser.add_argument("--root", help="Tree to port (default: the installed torchvision package).")
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

    bare = _bare_parse(files, args.jobs)
    port, changed = _port(root, args.jobs)
    every_trigger = tuple(r.triggers for r in rules.RULES)
    for rule in rules.RULES:  # prefilter off: "" is in every file
        object.__setattr__(rule, "triggers", ("",))
    from npu_migrate.port import _rules_for
    _rules_for.cache_clear()
    full, _ = _port(root, args.jobs)
    for rule, triggers in zip(rules.RULES, every_trigger):
        object.__setattr__(rule, "triggers", triggers)
    _rules_for.cache_clear()

    def row(name: str, seconds: float) -> str:
        return (f"{name:<28} {seconds:7.2f} s  {len(files) / seconds:8.1f} files/s  {mb / seconds:6.2f} MB/s"
                f"  {seconds / bare:5.2f}x bare parse")

    print(row("libcst.parse_module (bare)", bare))
    print(row("npu-migrate port", port) + f"  ({changed} files changed)")
    print(row("port, every file parsed", full))
    print(f"ratio port / bare parse: {port / bare:.2f} (goal: <= 2.0)")


if __name__ == "__main__":
    main()
