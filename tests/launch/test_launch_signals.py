"""SIGINT and SIGTERM reach the launcher in every phase of a job: real processes on loopback.

Each test waits (on the launcher's log in --log-dir) until the launcher is in the phase, sends the
signal, and checks the exit code (130 / 143), the one console line and that nothing is left.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from conftest import free_port
from support import JOB, Launch, all_pids, assert_all_gone, one_line_errors, wait_for_files, wait_for_text

SIGNALS = [pytest.param(signal.SIGINT, 130, id="SIGINT"), pytest.param(signal.SIGTERM, 143, id="SIGTERM")]


def multi(tmp: Path, rank: int, port: int, *extra: str, job: tuple[str, ...] = (), name: str | None = None,
          nnodes: str = "2") -> Launch:
    args = ["--nnodes", nnodes, "--node-rank", str(rank), "--device-num", "1", "--addr", "127.0.0.1",
            "--port", str(port), "--join-timeout", "300", "--node-timeout", "10", "--log-dir", str(tmp / "logs"),
            *extra, str(JOB), *job]
    return Launch(tmp, *args, name=name or f"node{rank}")


def log_of(tmp: Path, rank: int) -> Path:
    return tmp / "logs" / f"launcher-node{rank}.log"


def ends_with(launch: Launch, code: int, line: str) -> None:
    assert launch.wait() == code, launch.err
    one_line_errors(launch.err)
    assert launch.err.strip().splitlines()[-1] == f"npu-migrate launch: {line}"


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_while_connecting_to_node_0(tmp_path: Path, sig: int, code: int) -> None:
    node1 = multi(tmp_path, 1, free_port())  # node 0 never comes
    wait_for_text(log_of(tmp_path, 1), "node 1: connecting to node 0")
    node1.proc.send_signal(sig)
    ends_with(node1, code, f"received {signal.Signals(sig).name} while connecting to node 0: stopped; "
                           "no rank is left running on node 1.")


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_while_waiting_for_nodes(tmp_path: Path, sig: int, code: int) -> None:
    node0 = multi(tmp_path, 0, free_port())  # node 1 never comes
    wait_for_text(log_of(tmp_path, 0), "node 0: waiting for nodes")
    node0.proc.send_signal(sig)
    ends_with(node0, code, f"received {signal.Signals(sig).name} while waiting for nodes: stopped; "
                           "no rank is left running on node 0.")


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [*SIGNALS, pytest.param(signal.SIGHUP, 129, id="SIGHUP")])
def test_while_running_ends_every_node(tmp_path: Path, sig: int, code: int) -> None:
    port = free_port()
    hold = ("--hold", str(tmp_path / "never"))
    node0, node1 = multi(tmp_path, 0, port, job=hold), multi(tmp_path, 1, port, job=hold)
    wait_for_files(tmp_path, ["holding0", "holding1"])  # past every collective: node 1 hears it from the board
    pids = all_pids(tmp_path, 2)
    node0.proc.send_signal(sig)
    name = signal.Signals(sig).name
    ends_with(node0, code, f"received {name}: stopping 1 running rank(s) on node 0.")
    assert node1.wait() == 1
    assert f"error: the launcher of node 0 (" in node1.err and f"received {name}" in node1.err
    one_line_errors(node1.err)
    assert_all_gone(pids)


@pytest.mark.slow
def test_a_rank_whose_peer_the_signal_stopped_blames_the_signal(tmp_path: Path) -> None:
    """Node 1's rank waits in an all-reduce when node 0's launcher is stopped: it fails at once with a
    connection error, within a heartbeat of node 0's abort. Node 1 names the signal, not its rank."""
    port = free_port()
    node0, node1 = (multi(tmp_path, k, port, job=("--in-collective",)) for k in (0, 1))
    wait_for_files(tmp_path, ["holding0", "holding1"])
    pids = all_pids(tmp_path, 2)
    node0.proc.send_signal(signal.SIGTERM)
    ends_with(node0, 143, "received SIGTERM: stopping 1 running rank(s) on node 0.")
    assert node1.wait() == 1
    assert "error: the launcher of node 0 (" in node1.err and "received SIGTERM" in node1.err, node1.err
    assert "job failed" not in node1.err, node1.err
    one_line_errors(node1.err)
    assert_all_gone(pids)


@pytest.mark.long
@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_while_restarting(tmp_path: Path, sig: int, code: int) -> None:
    port = free_port()
    hold = ("--hold", str(tmp_path / "never"))
    node0 = multi(tmp_path, 0, port, "--max-restarts", "1", job=hold)
    node1 = multi(tmp_path, 1, port, "--max-restarts", "1", job=hold)
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    pids = all_pids(tmp_path, 2)
    node1.proc.kill()  # node 0 waits for a replacement that never comes
    node1.wait()
    wait_for_text(node0.stderr, "restarting the job (restart 1 of 1)")
    node0.proc.send_signal(sig)
    assert node0.wait() == code, node0.err
    one_line_errors(node0.err)
    assert f"received {signal.Signals(sig).name} while " in node0.err.strip().splitlines()[-1]
    assert_all_gone(pids)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_while_tearing_down(tmp_path: Path, sig: int, code: int) -> None:
    # Ranks that ignore SIGTERM keep the launcher stopping them for its (here long) grace period.
    job = Launch(tmp_path, "--device-num", "2", "--log-dir", str(tmp_path / "logs"), str(JOB), "--ignore-term",
                 "--fail", "--on-rank", "1", NPU_MIGRATE_STOP_GRACE_S="600")
    wait_for_text(log_of(tmp_path, 0), "node 0: stopping the ranks")
    job.proc.send_signal(sig)
    ends_with(job, code, f"received {signal.Signals(sig).name} while stopping the ranks: stopped; "
                         "no rank is left running on node 0.")
    assert_all_gone(all_pids(tmp_path, 2))


def test_stopping_waits_a_bounded_time_for_a_worker_that_survives_sigkill() -> None:
    # A worker in an uninterruptible kernel wait outlives SIGKILL; joining it without a timeout
    # would hang the launcher. The stand-in never ends; its pid is a process of ours in its own
    # group, so the launcher's signals reach nothing else.
    import subprocess
    import types

    from npu_migrate.launch.procs.ranks import RankProcesses
    from npu_migrate.launch.signals import REAP_AFTER_KILL_S

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)

    class Unkillable:
        pid, exitcode, timeouts = child.pid, None, []

        def join(self, timeout: float | None = None) -> None:
            if timeout is None:
                raise AssertionError("join() without a timeout would wait for ever")
            self.timeouts.append(timeout)

    try:
        stub = types.SimpleNamespace(stopped=set(), signals=types.SimpleNamespace(count=0), _context=object())
        procs = [Unkillable()]
        RankProcesses.stop(stub, procs, grace=0)  # type: ignore[arg-type]
        assert len(procs[0].timeouts) == 1 and 0 <= procs[0].timeouts[0] <= REAP_AFTER_KILL_S
        assert stub._context is None
    finally:
        child.kill()
        child.wait()
