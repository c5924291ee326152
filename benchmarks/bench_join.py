"""The multi-node control plane at many nodes: npu_migrate.launch against torchrun's c10d rendezvous.

Usage::

    python benchmarks/bench_join.py --simulate 16 64 256 1024 [--steady 10] [--node-timeout 20] [--hosts H]
    python benchmarks/bench_join.py --simulate 256 --only npu_migrate
    python benchmarks/bench_join.py --simulate --real 4 8 16

For each N, N simulated nodes run the real control-plane code against one real node 0 over TCP
on loopback, with no ranks: node 0 is a process of its own (it serves the store and runs node 0's
control plane, so its CPU, read syscalls and connections are readable in ``/proc``); the N - 1 others
are threads of H "host" processes (``--hosts``; by default one per 128 nodes: 8 at 1,024), each
with one torch import for all of its nodes, driven by this process through their stdin.

* **npu_migrate**: each node is a :class:`npu_migrate.launch.nodes.membership.Membership`
  (``connect()``, ``join()``: the job token, flags, node-rank claim, and the join by arrivals
  of a job without restarts, ``--max-restarts 0``), whose board beats as it does in a launcher.
* **torchrun**: each node is torch's ``DynamicRendezvousHandler`` over the c10d backend with
  torchrun's defaults (one store client per agent; ``next_rendezvous()``; torchrun's monitor
  loop calls ``num_nodes_waiting()`` every 0.1 s).

Figures per N (one row per side):

* ``join s``: from starting every node until every node has its round; ``ms/node``: the CPU
  the host processes spent joining, per simulated node (on a cluster each node has its own core; here
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
* ``node ms/s``: each simulated node's own control plane while the job runs (its heartbeat; the
  host processes' CPU per node), in ms of CPU a second: what N - 1 nodes ask of the machine that
  simulates them, where a cluster gives each its own;
* ``MB/node``: the host processes' RSS growth per simulated node;
* ``lost s``: from stopping one node (its heartbeat and torch's keep-alive) until node 0 names it
  (npu_migrate: the board's lost node; torchrun: its rendezvous state drops the participant);
* ``end s``: from one node publishing a rank's failure until every node's board says so
  (npu_migrate: ``fail/<gen>``; torchrun, restarts left: the failed agent re-joins and every
  agent's ``num_nodes_waiting()`` turns > 0; without restarts torchrun never tells the others).

``--real N ...`` checks the simulation with real processes: N launchers
(``python -m npu_migrate.launch --nnodes N --node-rank K --device-num 1``) and N torchrun agents
(``--rdzv-backend c10d``, node 0's agent the store's host), each on loopback with one CPU rank
running ``allreduce_job.py`` (join a gloo group, all-reduce once, leave), alternating; printed: the
seconds from starting every node until every one exited, and their ratio (goal at 16: <= 1).
(``--simulate`` with no N runs only these.)

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
# Simulated nodes per process by default: 128 joined in 0.6 s as threads of one process; 1,023 in one
# process (about 4,000 threads) did not finish in 7 minutes on 2 cores.
NODES_PER_HOST = 128


def free_port() -> int:
    """A free port P whose P + 1 is free too (the launcher's store listens on --port + 1)."""
    while True:
        with socket.socket() as sock, socket.socket() as after:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            try:
                after.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


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


# --------------------------------------------------------------------------- a host of simulated nodes


def host_main(side: str, n: int, port: int, node_timeout: float, first: int, last: int) -> None:
    """Nodes ``first``..``last`` as threads of this process, driven by one command a line on stdin.

    Commands: ``join`` (every node joins; answers ``joined <last done> <cpu s> <rss growth MB>`` or
    ``error <what>``), ``fail K`` (node K publishes a rank's failure), ``watch K`` (answers
    ``ended <time>`` once every node but K has seen the failure, ``ended nan`` after 120 s),
    ``kill K`` (node K stops as a killed launcher), ``stop``.
    """
    import torch  # noqa: F401 - once, before the nodes (the figures are per node)

    # The hosts stand for other machines: at the lowest priority, node 0's process gets the CPU a real
    # node 0 has to itself, where N - 1 nodes' threads on 2 shared cores would otherwise starve it.
    os.nice(19)
    # A launcher's main thread, blocked in a store call (the join's wait), looks at its signal flag
    # and its board every 0.1 s (npu_migrate.launch.signals.POLL_S): about 1 ms of CPU a second on
    # a node of its own, but 1,023 simulated main threads waking 10 times a second starve 2 cores
    # (the nodes' heartbeats then miss node 0 for 20 s). Here they look once a second; the join
    # itself is not delayed by it (a wait returns as soon as its call does), and no figure below is
    # read from a main thread.
    from npu_migrate.launch import signals

    signals.POLL_S = 1.0
    out, out_lock = sys.stdout, threading.Lock()

    def say(*words: Any) -> None:
        with out_lock:
            out.write(" ".join(str(w) for w in words) + "\n")
            out.flush()

    rss0 = rss_mb()
    make: Callable[[int], Any] = LauncherNode if side == "npu_migrate" else TorchrunNode  # type: ignore[assignment]
    nodes = {k: make(n, k, port, node_timeout) for k in range(first, last + 1)}
    monitor_stop = threading.Event()
    say("ready")
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "join":
            done: list[float] = []
            errors: list[str] = []

            def join(node: Any) -> None:
                try:
                    node.join()
                    done.append(time.time())
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    cause = exc.__cause__ or exc.__context__
                    errors.append(f"{type(exc).__name__}: {exc}"[:120] + (f" <- {cause!r}"[:200] if cause else ""))

            u0 = resource.getrusage(resource.RUSAGE_SELF)
            threads = [threading.Thread(target=join, args=(node,), daemon=True) for node in nodes.values()]
            for t in threads:
                t.start()
            for t in threads:
                t.join(900)
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            if errors or len(done) < len(nodes):
                say("error", f"{len(done)}/{len(nodes)} joined; {errors[:2]}".replace("\n", " "))
                continue
            say("joined", max(done), u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime, rss_mb() - rss0)
            if side == "torchrun":
                def monitor() -> None:  # torchrun's agents poll the rendezvous every 0.1 s
                    while not monitor_stop.is_set():
                        for node in nodes.values():
                            node.waiting()
                        monitor_stop.wait(0.1)

                threading.Thread(target=monitor, daemon=True).start()
        elif cmd == "fail":
            nodes[int(args[0])].fail()
        elif cmd == "watch":
            skip = int(args[0])

            def watch() -> None:
                deadline = time.time() + 120
                pending = {k for k in nodes if k != skip}
                ended = [0.0]
                while pending and time.time() < deadline:
                    for k in list(pending):
                        node = nodes[k]
                        if (node.event() is not None) if side == "npu_migrate" else (node.waiting() > 0):
                            pending.discard(k)
                            ended.append(time.time())
                    if pending:
                        time.sleep(0.05)
                say("ended", "nan" if pending else max(ended))

            threading.Thread(target=watch, daemon=True).start()
        elif cmd == "kill":
            nodes[int(args[0])].kill()
        elif cmd == "stop":
            break
    monitor_stop.set()
    for node in nodes.values():
        node.stop()


class Hosts:
    """The simulated nodes 1..N-1 spread over ``count`` processes (:func:`host_main`), one torch import each."""

    def __init__(self, side: str, n: int, port: int, node_timeout: float, count: int) -> None:
        ranks = list(range(1, n))
        share = -(-len(ranks) // count)
        self.spans = [(ranks[i], ranks[min(i + share, len(ranks)) - 1]) for i in range(0, len(ranks), share)]
        self.procs = [subprocess.Popen([sys.executable, __file__, "--host", side, str(n), str(port), str(node_timeout),
                                        str(a), str(b)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for a, b in self.spans]
        self.lines: list[tuple[int, list[str]]] = []
        self.seen = threading.Condition()
        for i, proc in enumerate(self.procs):
            threading.Thread(target=self._read, args=(i, proc), daemon=True).start()

    def _read(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            with self.seen:
                self.lines.append((i, line.split()))
                self.seen.notify_all()
        with self.seen:
            self.lines.append((i, ["exited"]))
            self.seen.notify_all()

    def host_of(self, node: int) -> int:
        return next(i for i, (a, b) in enumerate(self.spans) if a <= node <= b)

    def send(self, command: str, hosts: list[int] | None = None) -> None:
        for i in range(len(self.procs)) if hosts is None else hosts:
            self.procs[i].stdin.write(command + "\n")  # type: ignore[union-attr]
            self.procs[i].stdin.flush()  # type: ignore[union-attr]

    def answers(self, words: tuple[str, ...], timeout: float, hosts: list[int] | None = None) -> dict[int, list[str]]:
        """Each host's first line starting with one of ``words`` (or ``exited``) since the last call."""
        want = set(range(len(self.procs)) if hosts is None else hosts)

        def found() -> dict[int, list[str]]:
            got: dict[int, list[str]] = {}
            for i, line in self.lines:
                if i in want and i not in got and line and line[0] in (*words, "exited"):
                    got[i] = line
            return got

        with self.seen:
            self.seen.wait_for(lambda: len(found()) == len(want), timeout)
            got = found()
            self.lines = [(i, line) for i, line in self.lines if i not in got]
        return got

    def stop(self) -> None:
        for i in range(len(self.procs)):
            try:
                self.send("stop", [i])
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --------------------------------------------------------------------------- one side at one N


def run_side(side: str, n: int, steady: float, node_timeout: float, hosts: int) -> dict[str, Any]:
    port = free_port()
    port_store = port + 1 if side == "npu_migrate" else port  # the launcher's store: --port + 1 (CONTROL_PORT_OFFSET)
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

    result: dict[str, Any] = {"side": side, "n": n, "hosts": hosts}
    group: Hosts | None = None
    try:
        if wait_line("ready", 120) is None:
            raise RuntimeError(f"node 0 ({side}) did not start")
        group = Hosts(side, n, port, node_timeout, hosts)
        ready = group.answers(("ready",), 600)
        if len(ready) < len(group.procs) or any(line[0] != "ready" for line in ready.values()):
            raise RuntimeError(f"the hosts did not start: {ready}")

        t0, n0 = time.time(), cpu_seconds(child.pid)
        group.send("join")
        joined = group.answers(("joined", "error"), 960)
        joined0 = wait_line("joined", 60)
        bad = [" ".join(line) for line in joined.values() if line[0] != "joined"]
        if bad or len(joined) < len(group.procs) or joined0 is None:
            raise RuntimeError(f"join failed: {bad[:2] or 'a host did not answer'}")
        result["join_s"] = max(max(float(line[1]) for line in joined.values()), float(joined0[-1])) - t0
        # What joining cost: every simulated node's CPU (one core each on a cluster, 2 shared here) and node 0's.
        result["join_cpu_ms_node"] = 1000 * sum(float(line[2]) for line in joined.values()) / (n - 1)
        result["join_cpu_node0"] = cpu_seconds(child.pid) - n0
        result["mb_per_node"] = sum(float(line[3]) for line in joined.values()) / (n - 1)

        # Steady state: the job runs.
        time.sleep(min(2.0, steady))  # let the first beats after the join pass
        c0, r0, tt0, w0 = cpu_seconds(child.pid), read_syscalls(child.pid), thread_times(child.pid), time.time()
        b0, h0 = read_syscalls(child.pid, "rchar"), sum(cpu_seconds(p.pid) for p in group.procs)
        time.sleep(steady)
        c1, r1, w1 = cpu_seconds(child.pid), read_syscalls(child.pid), time.time()
        # Each simulated node's own control plane while the job runs (its heartbeat), in ms of CPU a second.
        result["node_ms_s"] = 1000 * (sum(cpu_seconds(p.pid) for p in group.procs) - h0) / (n - 1) / (w1 - w0)
        result["req_s"] = (r1 - r0) / (w1 - w0)
        result["kb_s"] = (read_syscalls(child.pid, "rchar") - b0) / (w1 - w0) / 1024
        result["cpu"] = (c1 - c0) / (w1 - w0)
        name, busy = busiest_thread(child.pid, tt0)
        result["top_thread"] = f"{name} {busy / (w1 - w0):.2f}"
        result["conns"] = connections(port_store)

        # One rank fails on node 1: every node learns it.
        t_fail = time.time()
        group.send("fail 1", [group.host_of(1)])
        group.send("watch 1")
        ended = group.answers(("ended",), 150)
        ev0 = wait_line("event", max(1.0, t_fail + 120 - time.time()))
        times = [float(line[1]) if line[0] == "ended" else float("nan") for line in ended.values()]
        complete = len(times) == len(group.procs) and all(t == t for t in times) and ev0
        result["end_s"] = max([*times, float(ev0[-1])]) - t_fail if complete else float("nan")  # type: ignore[index]

        # One node is killed: node 0 names it.
        t_kill = time.time()
        group.send(f"kill {n - 1}", [group.host_of(n - 1)])
        lost = wait_line("lost", 3 * node_timeout + 60)
        result["lost_s"] = float(lost[-1]) - t_kill if lost else float("nan")
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        result["error"] = str(exc)[:200]
    finally:
        if group is not None:
            group.stop()
        child.kill()
        child.wait()
    return result


# --------------------------------------------------------------------------- real launchers


ALLREDUCE_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce_job.py")


def real_job(side: str, n: int) -> dict[str, Any]:
    """N real launchers (or torchrun agents) on loopback, one CPU rank each, running allreduce_job.py.

    The time is from starting every node until every one has exited: join, one all-reduce, leave.
    """
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", BENCH_T0=repr(time.time()),
               BENCH_OPTIMIZER="0")

    def command(k: int) -> list[str]:
        if side == "npu_migrate":
            return [sys.executable, "-m", "npu_migrate.launch", "--nnodes", str(n), "--node-rank", str(k),
                    "--device-num", "1", "--addr", "127.0.0.1", "--port", str(port), ALLREDUCE_JOB]
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"bench{port}",
                "--rdzv-conf", f"is_host={int(k == 0)}", ALLREDUCE_JOB]

    t0 = time.time()
    procs = [subprocess.Popen(command(k), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for k in range(n)]
    errors = [proc.communicate(timeout=900)[1] for proc in procs]
    seconds = time.time() - t0
    bad = [(k, proc.returncode, errors[k][-300:]) for k, proc in enumerate(procs) if proc.returncode != 0]
    return {"side": side, "n": n, "job_s": seconds, **({"error": str(bad[:1])} if bad else {})}


def fmt(x: Any, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'N':>5} {'side':<12} {'hosts':>5} {'join s':>7} {'ms/node':>7} {'n0 cpu':>6} {'req/s':>8} {'KB/s':>7} {'cpu':>5} {'top thread':>20} {'conns':>6} "
            f"{'/node':>5} {'node ms/s':>9} {'MB/node':>7} {'lost s':>7} {'end s':>6}")
    out = [head, "-" * len(head)]
    for r in rows:
        per = r["conns"] / r["n"] if "conns" in r else None
        out.append(f"{r['n']:>5} {r['side']:<12} {fmt(r.get('hosts'), '5d')} {fmt(r.get('join_s'), '7.1f')} "
                   f"{fmt(r.get('join_cpu_ms_node'), '7.0f')} {fmt(r.get('join_cpu_node0'), '6.1f')} {fmt(r.get('req_s'), '8.0f')} {fmt(r.get('kb_s'), '7.0f')} "
                   f"{fmt(r.get('cpu'), '5.2f')} {r.get('top_thread', '-'):>20} {fmt(r.get('conns'), '6d')} "
                   f"{fmt(per, '5.2f')} {fmt(r.get('node_ms_s'), '9.2f')} {fmt(r.get('mb_per_node'), '7.2f')} {fmt(r.get('lost_s'), '7.1f')} "
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
    if argv and argv[0] == "--host":
        import logging

        logging.basicConfig(level=logging.CRITICAL)  # stopped nodes' keep-alive errors
        if os.environ.get("BENCH_JOIN_DUMP_S"):  # where a run stalls: every thread's stack, once, to stderr
            import faulthandler

            faulthandler.dump_traceback_later(float(os.environ["BENCH_JOIN_DUMP_S"]), exit=False)
        host_main(argv[1], int(argv[2]), int(argv[3]), float(argv[4]), int(argv[5]), int(argv[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate", type=int, nargs="*", default=[16, 64, 256, 1024])
    parser.add_argument("--only", choices=["npu_migrate", "torchrun"])
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of the running job measured")
    parser.add_argument("--node-timeout", type=float, default=20.0)
    parser.add_argument("--real", type=int, nargs="*", default=[],
                        help="also N real launchers and N torchrun agents on loopback, 1 rank each (e.g. 4 8 16)")
    parser.add_argument("--hosts", type=int, default=0,
                        help="processes the N - 1 simulated nodes are spread over (default: one per %d nodes)" % NODES_PER_HOST)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    rows = []
    for n in args.simulate:
        for side in ("npu_migrate", "torchrun"):
            if args.only and side != args.only:
                continue
            t = time.time()
            hosts = args.hosts or -(-(n - 1) // NODES_PER_HOST)
            row = run_side(side, n, args.steady, args.node_timeout, min(hosts, n - 1))
            row["wall_s"] = time.time() - t
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    real = []
    for n in args.real:  # the two sides alternate, the order reversed at each N
        for side in (("npu_migrate", "torchrun") if len(real) % 4 == 0 else ("torchrun", "npu_migrate")):
            if args.only and side != args.only:
                continue
            real.append(real_job(side, n))
            print(json.dumps(real[-1]), file=sys.stderr, flush=True)
    print(f"node timeout {args.node_timeout:g} s, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    if rows:
        print(table(rows))
    if real:
        print("real nodes on loopback, 1 CPU rank each, allreduce_job.py (join, all-reduce, leave): seconds from "
              "start until every node exited")
        for n in args.real:
            got = {r["side"]: r for r in real if r["n"] == n}
            cells = [f"{side} {got[side]['job_s']:6.1f}" + (" ERROR " + got[side]["error"] if "error" in got[side] else "")
                     for side in ("npu_migrate", "torchrun") if side in got]
            ratio = (f"  ratio {got['npu_migrate']['job_s'] / got['torchrun']['job_s']:.2f}"
                     if len(got) == 2 and not any("error" in r for r in got.values()) else "")
            print(f"  N {n:>3}: " + "; ".join(cells) + ratio)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows + real, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
