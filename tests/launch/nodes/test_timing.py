"""The launcher's windows that grow with the node count (:mod:`npu_migrate.launch.nodes.timing`) and who watches whom."""

from __future__ import annotations

import pytest

from npu_migrate.launch.nodes import timing
from npu_migrate.launch.nodes.board import watched
from npu_migrate.launch.nodes.records import Member


@pytest.mark.parametrize("node_timeout", [2.0, 5.0, 20.0, 60.0])
def test_small_jobs_keep_the_heartbeat_of_their_node_timeout(node_timeout: float) -> None:
    for nnodes in (1, 2, 16, 64):
        assert timing.heartbeat_interval(node_timeout, nnodes) == timing.heartbeat_interval(node_timeout)
        assert timing.lost_after(node_timeout, nnodes) == node_timeout
    assert timing.keep_alive_interval(node_timeout, 64) == timing.keep_alive_interval(node_timeout)


@pytest.mark.parametrize("node_timeout", [2.0, 5.0, 20.0, 60.0])
def test_node_0s_heartbeats_a_second_stay_bounded_at_any_node_count(node_timeout: float) -> None:
    for nnodes in (16, 256, 1024, 4096, 16384):
        interval = timing.heartbeat_interval(node_timeout, nnodes)
        assert nnodes / interval <= max(timing.NODE0_BEATS_PER_S, nnodes / timing.HEARTBEAT_MIN_S)
        assert nnodes / interval <= timing.NODE0_BEATS_PER_S or interval == timing.heartbeat_interval(node_timeout)
        # A loss needs LOST_MIN_BEATS silent beats at least, and the node timeout.
        assert timing.lost_after(node_timeout, nnodes) >= max(node_timeout, timing.LOST_MIN_BEATS * interval)
        assert nnodes / timing.keep_alive_interval(node_timeout, nnodes) <= max(
            timing.KEEP_ALIVES_PER_S, nnodes / timing.keep_alive_interval(node_timeout))


def test_the_formula_at_the_sizes_the_docs_name() -> None:
    assert timing.heartbeat_interval(20.0, 1024) == pytest.approx(2.048)
    assert timing.heartbeat_interval(20.0, 4096) == pytest.approx(8.192)
    assert timing.lost_after(20.0, 4096) == pytest.approx(40.96)
    assert timing.keep_alive_interval(20.0, 1024) == 11
    assert timing.linger_window(20.0, 4096) >= 2 * timing.heartbeat_interval(20.0, 4096)


def test_node_0_watches_every_node_and_the_others_watch_node_0() -> None:
    members = {k: Member(k, f"h{k}", f"o{k}", 0, None) for k in range(5)}
    assert sorted(watched(0, members)) == [1, 2, 3, 4]
    assert sorted(watched(3, members)) == [0]
    assert watched(3, {3: members[3]}) == {}
