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
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.signals import Signals


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
