"""What keeps node 0's load bounded at many nodes, on real launchers' membership over a real TCPStore.

Two nodes' :class:`~npu_migrate.launch.nodes.membership.Membership` (threads of this process, node
0's store on loopback) join as launchers do; the load itself is measured by
``benchmarks/bench_join.py --simulate N``.
"""

from __future__ import annotations

from concurrent import futures

import pytest

from conftest import free_port

from npu_migrate.launch.nodes.membership import Membership
from npu_migrate.launch.procs import cpplog
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.signals import Signals


@pytest.fixture(autouse=True)
def _c10_level_given_back():
    """A launcher's store client sets c10's log level for its whole process; here that is the test's."""
    with cpplog.kept():
        yield


def _join(max_restarts: int) -> list[Membership]:
    port = free_port()
    members = [Membership(LaunchConfig(nproc=1, nnodes=2, node_rank=k, addr="127.0.0.1", port=port,
                                       job_id=f"many{port}", max_restarts=max_restarts, join_timeout=120.0),
                          Signals()) for k in (0, 1)]
    members[0].connect()  # node 0 serves the store first, as its launcher does

    def node_1() -> None:
        members[1].connect()
        members[1].join()

    with futures.ThreadPoolExecutor(2) as pool:
        for joined in [pool.submit(members[0].join), pool.submit(node_1)]:
            joined.result(120)
    return members


def _keep_alive_stopped(member: Membership) -> bool:
    timer = member._handler._keep_alive_timer  # torch's _PeriodicTimer
    return timer is None or timer._ctx.stop_event.is_set()


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_torchs_keep_alive_runs_only_where_a_next_round_can_come(max_restarts: int) -> None:
    members = _join(max_restarts)
    try:
        assert [_keep_alive_stopped(m) for m in members] == [max_restarts == 0] * 2
    finally:
        for m in reversed(members):
            m.close()


def test_node_0_watches_the_others_and_they_watch_node_0() -> None:
    members = _join(0)
    try:
        watched = [sorted(m.board._state.last_change) for m in members]
        assert watched == [[1], [0]]
    finally:
        for m in reversed(members):
            m.close()


def _established(port: int) -> int:
    """Established connections whose local port is ``port`` (the store server's side), from /proc."""
    count = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            next(f)
            count += sum(1 for line in f if line.split()[3] == "01"
                         and int(line.split()[1].rsplit(":", 1)[1], 16) == port)
    return count


def test_a_joined_node_holds_two_connections_at_node_0_and_a_wait_for_a_present_key_opens_none() -> None:
    from npu_migrate.launch.setup.config import CONTROL_PORT_OFFSET

    members = _join(0)
    try:
        port = members[0].cfg.port + CONTROL_PORT_OFFSET
        held = 2 * len(members) + 1  # and node 0's server object's own client of itself (a TCPStore master is one)
        assert _established(port) == held
        js = members[1].js
        assert js.wait_keys([js.key("running")], 30)  # set by every node after its round
        assert _established(port) == held
    finally:
        for m in reversed(members):
            m.close()
