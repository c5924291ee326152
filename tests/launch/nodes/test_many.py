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
from npu_migrate.launch import cpplog
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


def _keep_alive_runs(member: Membership) -> bool:
    if member._handler is None:  # joined by arrivals: torch's rendezvous handler never made
        return False
    timer = member._handler._keep_alive_timer  # torch's _PeriodicTimer
    return timer is not None and not timer._ctx.stop_event.is_set()


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_torchs_keep_alive_runs_only_where_a_next_round_can_come(max_restarts: int) -> None:
    members = _join(max_restarts)
    try:
        assert [_keep_alive_runs(m) for m in members] == [max_restarts > 0] * 2
        assert [m.counted for m in members] == [max_restarts == 0] * 2
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
    from npu_migrate.launch.setup.ports import CONTROL_PORT_OFFSET

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


def test_a_launcher_that_took_a_listed_node_rank_over_is_refused_and_the_job_keeps_the_listed_one() -> None:
    """Joined by arrivals: node 0 listed node 1's first launcher; a second one found it silent
    (marked lost here), took the claim over and published its record too. The list decides."""
    from npu_migrate.launch.errors import LaunchError

    members = _join(0)
    late = Membership(LaunchConfig(nproc=1, nnodes=2, node_rank=1, addr="127.0.0.1", port=members[0].cfg.port,
                                   job_id=members[0].cfg.job_id, join_timeout=120.0), Signals())
    try:
        js = members[0].js
        js.store.set(js.key(f"lost/{members[1].js.owner}"), "marked lost by the test")
        late.connect()  # takes the claim over from the launcher marked lost
        with pytest.raises(LaunchError) as refused:
            late.join()
        assert str(refused.value).startswith("node rank 1 is already taken by the launcher on host ")
        assert str(refused.value).endswith("give every node a different --node-rank in [0, 2).")
        assert members[0].board._state.members[1].owner == members[1].js.owner
    finally:
        late.close()
        for m in reversed(members):
            m.close()


def test_a_node_that_never_comes_is_named_by_node_0_and_the_others_hear_why() -> None:
    """Joined by arrivals, node 2 of 3 never starts: node 0 ends the join at --join-timeout naming the
    node rank still missing, and node 1, which waits for node 0's list, ends with the same reason."""
    from npu_migrate.launch.errors import LaunchError
    from npu_migrate.launch.nodes.records import JobEvent

    port = free_port()
    members = [Membership(LaunchConfig(nproc=1, nnodes=3, node_rank=k, addr="127.0.0.1", port=port,
                                       job_id=f"many{port}", join_timeout=2.0, node_timeout=10.0), Signals())
               for k in (0, 1)]
    members[0].connect()
    members[1].connect()
    try:
        with futures.ThreadPoolExecutor(2) as pool:
            joins = [pool.submit(m.join) for m in members]
            errors = [j.exception(120) for j in joins]
        expected = ("not every node joined within 2 s (--join-timeout): node rank 2 did not come. Start the launcher "
                    f"on every node with --nnodes 3 --addr 127.0.0.1 --port {port}.")
        assert isinstance(errors[0], LaunchError) and str(errors[0]) == expected, errors
        assert isinstance(errors[1], JobEvent) and str(errors[1]) == expected, errors
    finally:
        for m in reversed(members):
            m.close()
