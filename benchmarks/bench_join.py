"""The multi-node control plane at many nodes: npu_migrate.launch against torchrun's c10d rendezvous.

Usage::

    python benchmarks/bench_join.py --simulate 16 64 256 1024 [--steady 10] [--node-timeout 20]
    python benchmarks/bench_join.py --simulate 256 --only npu_migrate

For each N, N simulated nodes run the real control-plane code against one real node 0 over TCP
on loopback, with no ranks: node 0 is a process of its own (it serves the store and runs node 0's
control plane, so its CPU, read syscalls and connections are readable in ``/proc``); the N - 1 others
are threads of this process (one torch import for all of them).

* **npu_migrate**: each node is a :class:`npu_migrate.launch.nodes.membership.Membership`
  (``connect()``, ``join()``: the job token, flags, node-rank claim, and the join by arrivals
  of a job without restarts, ``--max-restarts 0``), whose board beats as it does in a launcher.
* **torchrun**: each node is torch's ``DynamicRendezvousHandler`` over the c10d backend with
  torchrun's defaults (one store client per agent; ``next_rendezvous()``; torchrun's monitor
  loop calls ``num_nodes_waiting()`` every 0.1 s).

Figures per N (one row per side):

* ``join s``: from starting every node until every node has its round; ``ms/node``: the CPU
  this process spent joining, per simulated node (on a cluster each node has its own core; here
  two are shared, so where ``ms/node x N`` nears ``join s x 2`` the machine, not node 0, is what
  is measured); ``n0 cpu``: node 0's CPU seconds in that time;
* ``req/s``: node 0's store, read syscalls per second while the job runs (``/proc/<pid>/io``
  ``syscr``): one per request that waits for its answer (``add``, ``compare_set``, ``get``:
  measured 1.0), fewer for ``set``, which has none and whose requests share reads (0.37), so
  this is a floor of the requests;
* ``KB/s``: the bytes node 0's process reads in that time (``rchar``: what every node sends it);
* ``cpu``: node 0's process CPU in that time, in cores (store server and node 0's own control
  plane; the store thread's share beside it);
* ``conns``: established connections at node 0's store port (``/proc/net/tcp*``), and per node;
* ``MB/node``: this process's RSS growth per simulated node;
* ``lost s``: from stopping one node (its heartbeat and torch's keep-alive) until node 0 names it
  (npu_migrate: the board's lost node; torchrun: its rendezvous state drops the participant);
* ``end s``: from one node publishing a rank's failure until every node's board says so
  (npu_migrate: ``fail/<gen>``; torchrun, restarts left: the failed agent re-joins and every
  agent's ``num_nodes_waiting()`` turns > 0; without restarts torchrun never tells the others).

Each side runs under ``flock /tmp/bench.lock`` when started that way (one timing at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- /proc readings


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def read_syscalls(pid: int, field: str = "syscr") -> int:
    """``/proc/<pid>/io``: read syscalls (``syscr``), or bytes read (``rchar``, sockets included)."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def busiest_thread(pid: int, since: dict[int, float]) -> tuple[str, float]:
    """The thread of ``pid`` with the most CPU since ``since`` (tid -> seconds): its name and seconds."""
    best = ("", 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            used = cpu_seconds(pid, int(tid)) - since.get(int(tid), 0.0)
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if used > best[1]:
            best = (name, used)
    return best


def thread_times(pid: int) -> dict[int, float]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = cpu_seconds(pid, int(tid))
        except OSError:
            pass
    return out


def connections(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (the server's side)."""
    count = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "01" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        count += 1
        except OSError:
            pass
    return count


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# --------------------------------------------------------------------------- the two sides' nodes


def launcher_config(n: int, node_rank: int, port: int, node_timeout: float) -> Any:
    from npu_migrate.launch.setup.config import LaunchConfig

    return LaunchConfig(nproc=1, nnodes=n, node_rank=node_rank, addr="127.0.0.1", port=port,
                        job_id=f"bench{n}", node_timeout=node_timeout, join_timeout=600.0)


class LauncherNode:
    """One simulated node of npu_migrate.launch: its Membership, as the supervisor drives it."""

    def __init__(self, n: int, node_rank: int, port: int, node_timeout: float) -> None:
        from npu_migrate.launch.nodes.membership import Membership
        from npu_migrate.launch.signals import Signals

        self.node_rank = node_rank
        self.member = Membership(launcher_config(n, node_rank, port, node_timeout), Signals())

    def join(self) -> None:
        self.member.connect()
        self.member.join()

    def event(self) -> Any:
        return self.member.board.event()

    def lost(self) -> int | None:
        """The node rank this node's board names lost, if any (whatever else it says)."""
        board = self.member.board
        with board._lock:
            event = board._lost_node(board._state, time.monotonic())
        return None if event is None else event.record.node_rank

    def fail(self) -> None:
        from npu_migrate.launch.nodes.records import Failure

        self.member.board.publish_failure(Failure(rank=self.node_rank, local_rank=0, node_rank=self.node_rank,
                                                  host="sim", exit_code=1))

    def kill(self) -> None:
        """As a killed launcher: its heartbeat and torch's keep-alive stop."""
        self.member.board.stop()
        if self.member._handler is not None:
            self.member._handler._stop_heartbeats()

    stop = kill


class TorchrunNode:
    """One simulated torchrun agent: torch's DynamicRendezvousHandler on the c10d backend, torchrun's defaults."""

    def __init__(self, n: int, node_rank: int, port: int, node_timeout: float, server: Any = None) -> None:
        from datetime import timedelta

        from torch.distributed import TCPStore
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
            RendezvousTimeout,
        )

        self.node_rank = node_rank
        self.handler: Any = None
        self.rejoin: threading.Thread | None = None

        def make(store: Any) -> None:
            backend = C10dRendezvousBackend(store, f"bench{n}")
            self.handler = DynamicRendezvousHandler.from_backend(
                run_id=f"bench{n}", store=store, backend=backend, min_nodes=n, max_nodes=n,
                timeout=RendezvousTimeout(join=timedelta(seconds=600)))

        # An agent connects when it starts, as the launcher's nodes do in join(): both are timed.
        self._connect = lambda: make(server if server is not None else TCPStore(
            "127.0.0.1", port, None, False, timedelta(seconds=600)))

    def join(self) -> None:
        self._connect()
        self.handler.next_rendezvous()

    def waiting(self) -> int:
        """torchrun's monitor loop: nodes waiting for the next round (a restart), at most one store read a second."""
        return self.handler.num_nodes_waiting()

    def participants(self) -> int:
        with self.handler._heartbeat_lock:
            return len(self.handler._state_holder.state.participants)

    def fail(self) -> None:
        """torchrun with restarts left: the agent whose worker failed joins the next round."""
        self.rejoin = threading.Thread(target=self._rejoin, daemon=True)
        self.rejoin.start()

    def _rejoin(self) -> None:
        try:
            self.handler.next_rendezvous()
        except Exception:  # noqa: BLE001 - the benchmark ends before that round completes
            pass

    def kill(self) -> None:
        if self.handler is not None:
            self.handler._stop_heartbeats()

    stop = kill


# --------------------------------------------------------------------------- node 0 (a process of its own)


def node0_main(side: str, n: int, port: int, node_timeout: float) -> None:
    """Node 0: serve the store, join, then report what it sees (one line each, with time.time())."""
    out = sys.stdout

    def say(*words: Any) -> None:
        out.write(" ".join(str(w) for w in (*words, time.time())) + "\n")
        out.flush()

    if side == "npu_migrate":
        node: Any = LauncherNode(n, 0, port, node_timeout)
        node.member.connect()  # serves the store before the others connect
        say("ready", threading.get_native_id())
        node.member.join()
    else:
        from npu_migrate.launch.nodes import servers

        server = servers.serve("127.0.0.1", port, 600)
        say("ready", threading.get_native_id())
        node = TorchrunNode(n, 0, port, node_timeout, server=server)
        node.join()
    say("joined")
    named = failed = False
    while True:  # torchrun's monitor interval; the launcher's board is read as often
        if side == "npu_migrate":
            lost = node.lost()
            if lost is not None and not named:
                named = True
                say("lost", lost)
            if not failed and node.event() is not None:
                failed = True
                say("event")
        else:
            if not failed and node.waiting() > 0:
                failed = True
                left = node.participants()
                say("event")
            if failed and not named and node.participants() < left:  # the failed agent left first
                named = True
                say("lost", left - node.participants())
        time.sleep(0.1)


# --------------------------------------------------------------------------- one side at one N


def run_side(side: str, n: int, steady: float, node_timeout: float) -> dict[str, Any]:
    port = free_port()
    if side == "npu_migrate":
        port_store = port + 1  # --port + 1 (CONTROL_PORT_OFFSET)
        make: Callable[[int], Any] = lambda k: LauncherNode(n, k, port, node_timeout)
    else:
        port_store = port
        make = lambda k: TorchrunNode(n, k, port, node_timeout)
    child = subprocess.Popen([sys.executable, __file__, "--node0", side, str(n), str(port), str(node_timeout)],
                             stdout=subprocess.PIPE, text=True)
    lines: list[list[str]] = []
    seen = threading.Condition()

    def read() -> None:
        for line in child.stdout:  # type: ignore[union-attr]
            with seen:
                lines.append(line.split())
                seen.notify_all()

    threading.Thread(target=read, daemon=True).start()

    def wait_line(word: str, timeout: float) -> list[str] | None:
        with seen:
            seen.wait_for(lambda: any(x[0] == word for x in lines) or child.poll() is not None, timeout)
            return next((x for x in lines if x[0] == word), None)

    result: dict[str, Any] = {"side": side, "n": n}
    try:
        if wait_line("ready", 120) is None:
            raise RuntimeError(f"node 0 ({side}) did not start")
        rss0 = rss_mb()
        nodes: list[Any] = []
        nodes.extend(make(k) for k in range(1, n))
        done: list[float] = []
        errors: list[str] = []

        def join(node: Any) -> None:
            try:
                node.join()
                done.append(time.time())
            except Exception as exc:  # noqa: BLE001 - reported in the table
                cause = exc.__cause__ or exc.__context__
                errors.append(f"{type(exc).__name__}: {exc}"[:120] + (f" <- {cause!r}"[:200] if cause else ""))

        t0, u0, n0 = time.time(), resource.getrusage(resource.RUSAGE_SELF), cpu_seconds(child.pid)
        threads = [threading.Thread(target=join, args=(node,), daemon=True) for node in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        joined0 = wait_line("joined", 60)
        if errors or joined0 is None or len(done) < n - 1:
            raise RuntimeError(f"join failed: {len(done)}/{n - 1} joined; {errors[:2]}")
        result["join_s"] = max(max(done), float(joined0[-1])) - t0
        u1 = resource.getrusage(resource.RUSAGE_SELF)
        # What joining cost: every simulated node's CPU (one core each on a cluster, 2 shared here) and node 0's.
        result["join_cpu_ms_node"] = 1000 * (u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime) / (n - 1)
        result["join_cpu_node0"] = cpu_seconds(child.pid) - n0
        result["mb_per_node"] = (rss_mb() - rss0) / (n - 1)

        # Steady state: the job runs.
        monitor_stop = threading.Event()
        if side == "torchrun":
            def monitor() -> None:  # torchrun's agents poll the rendezvous every 0.1 s
                while not monitor_stop.is_set():
                    for node in nodes:
                        node.waiting()
                    monitor_stop.wait(0.1)

            threading.Thread(target=monitor, daemon=True).start()
        time.sleep(min(2.0, steady))  # let the first beats after the join pass
        c0, r0, tt0, w0 = cpu_seconds(child.pid), read_syscalls(child.pid), thread_times(child.pid), time.time()
        b0 = read_syscalls(child.pid, "rchar")
        time.sleep(steady)
        c1, r1, w1 = cpu_seconds(child.pid), read_syscalls(child.pid), time.time()
        result["req_s"] = (r1 - r0) / (w1 - w0)
        result["kb_s"] = (read_syscalls(child.pid, "rchar") - b0) / (w1 - w0) / 1024
        result["cpu"] = (c1 - c0) / (w1 - w0)
        name, busy = busiest_thread(child.pid, tt0)
        result["top_thread"] = f"{name} {busy / (w1 - w0):.2f}"
        result["conns"] = connections(port_store)

        # One rank fails on node 1: every node learns it.
        t_fail = time.time()
        nodes[0].fail()
        deadline = t_fail + 120
        pending = set(range(1, len(nodes)))
        ended: list[float] = []
        while pending and time.time() < deadline:
            for i in list(pending):
                hit = nodes[i].event() is not None if side == "npu_migrate" else nodes[i].waiting() > 0
                if hit:
                    pending.discard(i)
                    ended.append(time.time())
            if pending:
                time.sleep(0.05)
        ev0 = wait_line("event", max(1.0, deadline - time.time()))
        result["end_s"] = (max([*ended, float(ev0[-1])]) - t_fail) if not pending and ev0 else float("nan")

        # One node is killed: node 0 names it.
        t_kill = time.time()
        nodes[-1].kill()
        lost = wait_line("lost", 3 * node_timeout + 60)
        result["lost_s"] = float(lost[-1]) - t_kill if lost else float("nan")
        monitor_stop.set()
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        result["error"] = str(exc)[:200]
    finally:
        for node in locals().get("nodes", []):
            node.stop()
        child.kill()
        child.wait()
    return result


def fmt(x: Any, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'N':>5} {'side':<12} {'join s':>7} {'ms/node':>7} {'n0 cpu':>6} {'req/s':>8} {'KB/s':>7} {'cpu':>5} {'top thread':>20} {'conns':>6} "
            f"{'/node':>5} {'MB/node':>7} {'lost s':>7} {'end s':>6}")
    out = [head, "-" * len(head)]
    for r in rows:
        per = r["conns"] / r["n"] if "conns" in r else None
        out.append(f"{r['n']:>5} {r['side']:<12} {fmt(r.get('join_s'), '7.1f')} "
                   f"{fmt(r.get('join_cpu_ms_node'), '7.0f')} {fmt(r.get('join_cpu_node0'), '6.1f')} {fmt(r.get('req_s'), '8.0f')} {fmt(r.get('kb_s'), '7.0f')} "
                   f"{fmt(r.get('cpu'), '5.2f')} {r.get('top_thread', '-'):>20} {fmt(r.get('conns'), '6d')} "
                   f"{fmt(per, '5.2f')} {fmt(r.get('mb_per_node'), '7.2f')} {fmt(r.get('lost_s'), '7.1f')} "
                   f"{fmt(r.get('end_s'), '6.2f')}" + (f"  ERROR {r['error']}" if "error" in r else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--node0":
        import logging

        logging.basicConfig(level=logging.ERROR)
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
        node0_main(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--only", choices=["npu_migrate", "torchrun"])
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of the running job measured")
    parser.add_argument("--node-timeout", type=float, default=20.0)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import logging

    import torch  # noqa: F401 - once, before any node (the figures are per node)

    if os.environ.get("BENCH_JOIN_DUMP_S"):  # where a run stalls: every thread's stack, once, to stderr
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["BENCH_JOIN_DUMP_S"]), exit=False)

    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)  # stopped nodes' keep-alive errors

    rows = []
    for n in args.simulate:
        for side in ("npu_migrate", "torchrun"):
            if args.only and side != args.only:
                continue
            t = time.time()
            row = run_side(side, n, args.steady, args.node_timeout)
            row["wall_s"] = time.time() - t
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"node timeout {args.node_timeout:g} s, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
