"""Eight real nodes: a lost node, a duplicate node rank and a hang behave as their two-node tests say.

Eight network-namespace hosts (:class:`support.Hosts`: host 0 linked to each of the others and
forwarding between them, as a switch would), one launcher with one CPU rank on each, node 0's
address as ``--addr``: what ``test_hosts.py``, ``test_duplicate.py`` and ``test_hang.py`` check with
two nodes, checked with eight (issue 40's many nodes; the load at hundreds of nodes is measured by
``benchmarks/bench_join.py --simulate``). The hosts are made once for the module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS
from support import (HOSTS_NODE_TIMEOUT, JOB, Hosts, Launch, host_launcher, netns_unavailable, one_line_errors,
                     rank_block, reports, wait_all, wait_for_files)

_WHY = netns_unavailable()
pytestmark = [pytest.mark.skipif(_WHY is not None, reason=_WHY or ""), pytest.mark.long]

NODES = 8
HANG_JOB = LAUNCH_SCRIPTS / "hang_job.py"


@pytest.fixture(scope="module")
def eight():
    made = Hosts(NODES)
    yield made
    made.remove()


def start(tmp: Path, hosts: Hosts, script: Path, *extra: str, job: tuple[str, ...] = ()) -> list[Launch]:
    """One launcher of one rank on each host, each with its own ``--error-file`` (``error<node>.json``)."""
    return [host_launcher(tmp, hosts, k, script, *extra, "--error-file", str(tmp / f"error{k}.json"), nproc="1",
                          job=job) for k in range(NODES)]


def test_a_killed_launcher_among_eight_is_named_on_every_node(tmp_path: Path, eight: Hosts) -> None:
    hold = ("--hold", str(tmp_path / "never"))  # ranks sit outside any collective: only launchers notice
    nodes = start(tmp_path, eight, JOB, job=hold)
    # Past both all-reduces on every rank: killed during the second, node 5 would fail a rank of
    # another node with gloo's "Connection closed by peer" before any launcher missed its heartbeat.
    wait_for_files(tmp_path, [f"holding{r}" for r in range(NODES)])
    got = reports(tmp_path, NODES)
    # Every rank all-reduced with the seven others, each from its own host's link.
    assert [(r["env"]["NODE_RANK"], r["env"]["RANK"], r["sum"]) for r in got] == [
        (str(k), str(k), float(sum(range(1, NODES + 1)))) for k in range(NODES)]
    assert [r["extra_env"]["GLOO_SOCKET_IFNAME"] for r in got[1:]] == [eight.link(k) for k in range(1, NODES)]
    nodes[5].proc.kill()
    nodes[5].wait()
    codes = wait_all([n for k, n in enumerate(nodes) if k != 5])
    assert codes == [1] * (NODES - 1)
    headline = f"lost node 5 (vm ({eight.addrs[5]})): no heartbeat for {HOSTS_NODE_TIMEOUT} s"
    for k, node in enumerate(nodes):
        if k != 5:
            assert headline in node.err.replace(eight.names[5], "vm"), (k, node.err)
            one_line_errors(node.err)
    eight.assert_empty()


def test_a_duplicate_node_rank_among_eight_is_refused_and_the_job_finishes(tmp_path: Path, eight: Hosts) -> None:
    release = tmp_path / "release"
    nodes = start(tmp_path, eight, JOB, job=("--hold", str(release)))
    wait_for_files(tmp_path, [f"rank{r}.json" for r in range(NODES)])
    # A second launcher claims node rank 3 from host 3 while the job runs.
    duplicate = host_launcher(tmp_path, eight, 3, JOB, nproc="1", name="duplicate", job=("--hold", str(release)))
    assert duplicate.wait() == 1, duplicate.err
    one_line_errors(duplicate.err)
    errors = [line for line in duplicate.err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("npu-migrate launch: error: "), duplicate.err
    assert "node rank 3 is already taken by the launcher on host" in errors[0], errors
    assert errors[0].endswith(f"give every node a different --node-rank in [0, {NODES})."), errors
    release.touch()
    assert wait_all(nodes) == [0] * NODES, [n.err for n in nodes]
    assert f"all {NODES} nodes joined" in nodes[0].err
    eight.assert_empty()


def test_a_hang_among_eight_is_reported_by_node_0_and_every_node_shows_its_stacks(tmp_path: Path,
                                                                                 eight: Hosts) -> None:
    nodes = start(tmp_path, eight, HANG_JOB, "--hang-timeout", "5", job=("--skip", "6"))
    assert wait_all(nodes) == [1] * NODES, [n.err for n in nodes]
    summary = "rank 6 is not in a collective (last: all_reduce #3 ended "
    err0 = nodes[0].err
    assert f"hang: {summary}" in err0 and "; ranks 0, 1, 2, 3, 4, 5, 7 are in all_reduce #4 since" in err0, err0
    for k, node in enumerate(nodes):
        if k:
            assert f"node 0 reports a hang: {summary}" in node.err, (k, node.err)
        block = rank_block(node.err, k)  # each launcher shows its own rank's stack
        if k == 6:
            assert block.startswith("--- rank 6 on node 6: not in a collective") and "in sleep_wait" in block, block
        else:
            assert block.startswith(f"--- rank {k} on node {k}: in all_reduce #4 since"), block
    for k in range(NODES):  # every node's report agrees, and holds its own rank's stack
        report = json.loads((tmp_path / f"error{k}.json").read_text())
        assert report["outcome"] == "hang" and report["first_failure"]["behind"] == [6], (k, report)
        assert list(report["hang"]["stacks"]) == [str(k)], (k, report["hang"])
    eight.assert_empty()
