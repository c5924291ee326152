"""Launcher start-up: npu_migrate.launch against torchrun on the same 2-rank job.

Usage::

    python benchmarks/bench_launch.py [--rounds 9] [--nproc 2]

Runs ``allreduce_job.py`` (join a gloo group, all-reduce once; then again with an Adam step, as
training scripts do) under
``python -m npu_migrate.launch --device-num N`` and ``python -m torch.distributed.run
--nproc-per-node N``, alternating, and prints the median wall time of each, their ratio (goal:
<= 0.6) and where the time goes: when rank 0's script started, when torch was imported in it,
when the group was joined, and when the launcher had exited.

Then two launchers as two nodes on loopback (1 rank each): the time from starting both until
both say every node joined (the rendezvous), and the time from SIGKILL of node 1's launcher until
node 0's launcher has ended the job (``--node-timeout``, default 20 s, plus the check interval).

Then hang detection: the latency from the moment a 2-rank job stalls (one rank skips an
all-reduce) until the launcher prints the hang with every stack (goal: ``--hang-timeout`` + <= 5 s),
and the flight record's cost per collective: ``dist.all_reduce`` on a 1-rank gloo group, and a
no-op function, each wrapped and unwrapped, alternating blocks in one process (``--only hang``
runs just these).
Then the output relay's cost (issue 11): a 2-rank job printing 200,000 lines in total, its console
a file (as ``> train.log``), run through the relay (default prefix on) and with the workers on
the launcher's own descriptors (``--inherit-output``, the pre-relay behaviour), alternating; the
median wall-time ratio (goal: <= 1.05), with Python's default buffering and with
``PYTHONUNBUFFERED=1``, and the ratios of the ranks' own printing time and of the CPU time of the
whole process tree (less sensitive to a busy machine than wall time). Each relayed run is checked for every
line, whole.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
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
    # The rank's JSON line, after the launcher's rank prefix where there is one.
    marks = json.loads([line[line.index("{"):] for line in result.stdout.splitlines() if "{" in line][-1])
    return {"wall": wall, **marks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="Runs of each launcher (default: %(default)s).")
    parser.add_argument("--nproc", type=int, default=2, help="Ranks (default: %(default)s).")
    parser.add_argument("--node-rounds", type=int, default=2,
                        help="Runs of the two-node join and node-loss measurement (default: %(default)s).")
    parser.add_argument("--node-timeout", type=float, default=20.0,
                        help="The launchers' --node-timeout in that measurement (default: %(default)s, the launcher's).")
    parser.add_argument("--relay-rounds", type=int, default=5,
                        help="Runs of each mode in the output relay measurement (default: %(default)s).")
    parser.add_argument("--relay-lines", type=int, default=200_000,
                        help="Lines the 2 ranks print in total there (default: %(default)s).")
    parser.add_argument("--hang-timeout", type=float, default=5.0,
                        help="--hang-timeout of the hang-latency measurement (default: %(default)s).")
    parser.add_argument("--hang-rounds", type=int, default=2, help="Runs of the hang measurement (default: %(default)s).")
    parser.add_argument("--only", choices=["startup", "nodes", "relay", "hang"], default=None,
                        help="Run only one of the measurements (default: all).")
    args = parser.parse_args()
    if args.only in (None, "startup"):
        startup(args)
    if args.only in (None, "nodes"):
        multinode(args.node_rounds, args.node_timeout)
    if args.only in (None, "relay"):
        relay(args.relay_rounds, args.relay_lines)
    if args.only in (None, "hang"):
        flight_overhead()
        hang_latency(args.hang_rounds, args.hang_timeout)


def startup(args: argparse.Namespace) -> None:
    """npu_migrate.launch against torchrun on the same job, alternating."""
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


HOLD_JOB = """
import os, time
import npu_migrate as nm
info = nm.init_distributed()
open(os.path.join(os.environ["BENCH_DIR"], f"rank{info.rank}"), "w").close()
time.sleep(3600)
"""


def _launcher(rank: int, port: int, script: Path, work: Path, node_timeout: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--nnodes", "2", "--node-rank", str(rank), "--device-num",
           "1", "--addr", "127.0.0.1", "--port", str(port), "--node-timeout", str(node_timeout), str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", BENCH_DIR=str(work),
               BENCH_T0=repr(time.time()), BENCH_OPTIMIZER="0")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(work / f"node{rank}.err", "w"))


def _wait(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: {what} did not happen within {timeout} s")
        time.sleep(0.01)


def _port_pair() -> int:
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise SystemExit("error: no pair of free ports")


def multinode(rounds: int, node_timeout: float) -> None:
    """Two launchers as two nodes: time to join, and time from a node's loss to the job's end."""
    joins, losses = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench_launch_") as tmp:
            work = Path(tmp)
            script = work / "hold.py"
            script.write_text(HOLD_JOB)
            port = _port_pair()
            t0 = time.perf_counter()
            nodes = [_launcher(rank, port, script, work, node_timeout) for rank in (0, 1)]
            joined = lambda: all("nodes joined" in (work / f"node{r}.err").read_text() for r in (0, 1))  # noqa: E731
            _wait(joined, "2 nodes joining")
            joins.append(time.perf_counter() - t0)
            _wait(lambda: all((work / f"rank{r}").exists() for r in (0, 1)), "both ranks starting")
            t1 = time.perf_counter()
            nodes[1].send_signal(signal.SIGKILL)
            code = nodes[0].wait(timeout=node_timeout * 3 + 60)
            losses.append(time.perf_counter() - t1)
            nodes[1].wait()
            if code != 1 or "lost node 1" not in (work / "node0.err").read_text():
                raise SystemExit(f"error: node 0 ended with {code}:\n{(work / 'node0.err').read_text()}")
    print(f"\n2 launchers as 2 nodes on loopback, 1 rank each; {rounds} run(s), medians in seconds")
    print(f"start to every node joined (rendezvous):           {statistics.median(joins):6.2f} "
          f"(per run: {', '.join(f'{j:.2f}' for j in joins)})")
    print(f"node 1's launcher SIGKILLed to node 0's job ended: {statistics.median(losses):6.2f} "
          f"(per run: {', '.join(f'{j:.2f}' for j in losses)}; --node-timeout {node_timeout:g}; goal <= 30 "
          "with the default 20)")


HANG_JOB = Path(__file__).resolve().parent.parent / "tests" / "launch" / "scripts" / "hang_job.py"


def hang_latency(rounds: int, timeout: float) -> None:
    """From the stall (the last flight-record change of any rank) to the launcher's hang line."""
    latencies = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench_hang_") as tmp:
            work = Path(tmp)
            error_file = work / "error.json"
            cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", "--hang-timeout", str(timeout),
                   "--error-file", str(error_file), str(HANG_JOB), "--skip", "1"]
            env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", OUT_DIR=str(work))
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            seen = None
            for line in proc.stderr:  # type: ignore[union-attr]
                if seen is None and "hang: no rank made progress" in line:
                    seen = time.time()
            proc.wait()
            if seen is None or proc.returncode != 1:
                raise SystemExit(f"error: no hang report (exit code {proc.returncode})")
            states = json.loads(error_file.read_text())["hang"]["states"].values()
            stalled = max(max(s["entered"], s["ended"]) for s in states)
            latencies.append(seen - stalled)
    print(f"\nhang to report: 2 ranks, one skips an all-reduce; --hang-timeout {timeout:g}; {rounds} run(s)")
    print(f"stall to the launcher's hang line: median {statistics.median(latencies):.2f} s (per run: "
          f"{', '.join(f'{x:.2f}' for x in latencies)}); goal <= timeout + 5 = {timeout + 5:g} s")


def flight_overhead(blocks: int = 21, calls: int = 2000) -> None:
    """ns per call that the flight record adds: wrapped vs unwrapped, alternating blocks in one process."""
    code = f"""
import os, statistics, tempfile, time, json
import torch, torch.distributed as dist
from npu_migrate.launch.hangs import flight
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str({free_port()}), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
record = flight.FlightRecord(os.path.join(tempfile.mkdtemp(), "r.bin"), 0)
plain_ar = dist.all_reduce
wrapped_ar = flight._wrap("all_reduce", plain_ar, record)
noop = lambda tensor, op=None, group=None, async_op=False: None
wrapped_noop = flight._wrap("all_reduce", noop, record)
t = torch.ones(1)
def per_call(fn, n):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(t)
    return (time.perf_counter_ns() - t0) / n
out = {{"ar": [], "ar_wrapped": [], "noop": [], "noop_wrapped": []}}
for i in range({blocks}):
    pairs = [("ar", plain_ar), ("ar_wrapped", wrapped_ar), ("noop", noop), ("noop_wrapped", wrapped_noop)]
    for name, fn in (pairs if i % 2 == 0 else pairs[::-1]):
        out[name].append(per_call(fn, {calls}))
dist.destroy_process_group()
print(json.dumps({{k: statistics.median(v) for k, v in out.items()}}))
"""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"error: the overhead measurement failed:\n{result.stderr[-2000:]}")
    med = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"\nflight record per collective ({blocks} alternating blocks of {calls} calls, medians, ns per call)")
    print(f"dist.all_reduce, 1-rank gloo: unwrapped {med['ar']:9.0f}  wrapped {med['ar_wrapped']:9.0f}  "
          f"added {med['ar_wrapped'] - med['ar']:7.0f} ({med['ar_wrapped'] / med['ar']:.3f}x)")
    print(f"no-op function:               unwrapped {med['noop']:9.0f}  wrapped {med['noop_wrapped']:9.0f}  "
          f"added {med['noop_wrapped'] - med['noop']:7.0f} (the record's own cost)")
PRINT_JOB = """
import os, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
count = int(os.environ["BENCH_LINES"]) // world
line = f"rank {rank} step loss=0.123456 lr=0.001 " + "x" * 30
t0 = time.perf_counter()
for i in range(count):
    print(line, i)
sys.stdout.flush()
with open(os.path.join(os.environ["BENCH_DIR"], f"print{rank}"), "w") as fh:
    fh.write(repr(time.perf_counter() - t0))
"""


def _print_run(script: Path, work: Path, lines: int, inherit: bool, unbuffered: bool) -> dict[str, float]:
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2",
           *(["--inherit-output"] if inherit else []), str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", BENCH_DIR=str(work), BENCH_LINES=str(lines))
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    console = work / "console.txt"
    with console.open("wb") as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        code = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.PIPE, timeout=600).returncode
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the launcher, its fork server and the ranks (each reaps its children).
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if code != 0:
        raise SystemExit(f"error: the print job failed ({code})")
    if not inherit:  # every line arrived, whole, with its rank's prefix
        with console.open("rb") as fh:
            got = sum(1 for line in fh if re.fullmatch(rb"\[\S+ node0 rank(\d)\] rank \1 step .* \d+\n", line))
        if got != lines:
            raise SystemExit(f"error: the relay delivered {got} whole lines of {lines}")
    printing = max(float((work / f"print{r}").read_text()) for r in (0, 1))
    return {"wall": wall, "printing": printing, "cpu": cpu}


def _relay_alone(lines: int, unbuffered: bool) -> float:
    """CPU seconds of the relay's reader alone: this process relays 2 writer processes' lines."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from npu_migrate.launch.setup.config import LaunchConfig
    from npu_migrate.launch.procs.output import OutputSettings, Relay, fifo_paths

    env = dict(os.environ, BENCH_LINES=str(lines), WORLD_SIZE="2")
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    with tempfile.TemporaryDirectory(prefix="bench_relay_") as tmp:
        env["BENCH_DIR"] = tmp
        script = Path(tmp) / "print_job.py"
        script.write_text(PRINT_JOB)
        saved = os.dup(1)
        with open(Path(tmp) / "console.txt", "wb") as console:
            os.dup2(console.fileno(), 1)  # the relay writes to fd 1, as in the launcher
            try:
                cfg = LaunchConfig(nproc=2)
                relay = Relay(OutputSettings(), cfg, tmp, 0)
                before = resource.getrusage(resource.RUSAGE_SELF)
                relay.start()
                procs = []
                for local in (0, 1):
                    out, err = fifo_paths(tmp, local)
                    with open(out, "wb") as o, open(err, "wb") as e:
                        procs.append(subprocess.Popen([sys.executable, str(script)], stdout=o, stderr=e,
                                                      env=dict(env, RANK=str(local))))
                for proc in procs:
                    proc.wait()
                relay.drain()
                after = resource.getrusage(resource.RUSAGE_SELF)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
        return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def relay(rounds: int, lines: int) -> None:
    """The output relay against inherited descriptors on a job that prints ``lines`` lines."""
    print(f"\noutput relay: 2 ranks print {lines:,} lines in total to the launcher's console (a file); "
          f"{rounds} alternating runs each, medians in seconds")
    print(f"{'buffering':<20} {'mode':<22} {'printing':>8} {'wall':>7} {'cpu':>7}")
    with tempfile.TemporaryDirectory(prefix="bench_relay_") as tmp:
        work = Path(tmp)
        script = work / "print_job.py"
        script.write_text(PRINT_JOB)
        _print_run(script, work, lines, False, False)  # warm the page cache
        for unbuffered in (False, True):
            runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
            for i in range(rounds):
                for inherit in ((True, False) if i % 2 == 0 else (False, True)):
                    runs[inherit].append(_print_run(script, work, lines, inherit, unbuffered))
            buffering = "PYTHONUNBUFFERED=1" if unbuffered else "default (block)"
            for inherit, name in ((True, "inherited descriptors"), (False, "relay")):
                med = {k: statistics.median(r[k] for r in runs[inherit]) for k in ("printing", "wall", "cpu")}
                print(f"{buffering:<20} {name:<22} {med['printing']:>8.2f} {med['wall']:>7.2f} {med['cpu']:>7.2f}")
            ratios = [a["wall"] / b["wall"] for a, b in zip(runs[False], runs[True])]
            printing = [a["printing"] / b["printing"] for a, b in zip(runs[False], runs[True])]
            cpu = [a["cpu"] / b["cpu"] for a, b in zip(runs[False], runs[True])]
            print(f"{buffering:<20} wall-time ratio relay / inherited: median {statistics.median(ratios):.3f} "
                  f"(per round: {', '.join(f'{r:.3f}' for r in ratios)}); goal <= 1.05")
            alone = statistics.median(_relay_alone(lines, unbuffered) for _ in range(3))
            print(f"{buffering:<20} printing-time ratio {statistics.median(printing):.3f}, CPU-time ratio "
                  f"(launcher + ranks) {statistics.median(cpu):.3f}; the relay's reader alone: {alone:.3f} CPU s "
                  f"for {lines:,} lines")


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
          f"(per round: {', '.join(f'{r:.2f}' for r in ratios)}); goal <= 0.60")


if __name__ == "__main__":
    main()
