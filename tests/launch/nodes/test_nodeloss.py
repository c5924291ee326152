"""A node lost while its peers' ranks are inside a collective: the report names the node, not the peers' errors.

Two network-namespace hosts (:class:`support.Hosts`); node 1's launcher is SIGKILLed, its
ranks die with it, and node 0's ranks fail at once with the backend's "Connection reset by peer
[<node 1's address>]". Node 0 must say that node 1 (and its host) was lost, first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS
from support import (Hosts, Launch, host_launcher, hosts,  # noqa: F401 (fixture)
                     netns_unavailable, wait_for_files)

_WHY = netns_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

LOOP = LAUNCH_SCRIPTS / "collective_loop.py"
def node(tmp: Path, hosts: Hosts, rank: int, *extra: str) -> Launch:
    return host_launcher(tmp, hosts, rank, LOOP, *extra)


@pytest.mark.long
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_launcher_is_named_as_the_lost_node(tmp_path: Path, hosts: Hosts, killed: int) -> None:
    survivor = 1 - killed
    error_file = tmp_path / "error.json"
    nodes = [node(tmp_path, hosts, k, *(("--error-file", str(error_file)) if k == survivor else ())) for k in (0, 1)]
    wait_for_files(tmp_path, [f"rank{r}.json" for r in range(4)])
    nodes[killed].proc.kill()
    nodes[killed].wait()
    assert nodes[survivor].wait() == 1
    err = nodes[survivor].err
    lines = [line for line in err.splitlines() if line.startswith("npu-migrate launch: ")]
    # The cause first: the lost node and its host, before (and instead of) the survivor's rank that failed after it.
    headline = next(line for line in lines if "lost node" in line or "failed" in line)
    where = f"({hosts.addrs[killed]})"
    assert headline.startswith(f"npu-migrate launch: lost node {killed} (") and where in headline, err
    # Only the launcher's own lines are checked for tracebacks: the rank's is quoted on purpose.
    assert not any("Traceback" in line for line in lines), err
    first = json.loads(error_file.read_text())["first_failure"]
    assert (first["kind"], first["node_rank"]) == ("lost", killed), first
    assert where in first["host"] and first["message"].startswith(f"lost node {killed} ("), first
    if killed == 1:  # node 0 found node 1 gone by asking it (node 1 would find node 0's store gone)
        assert "its launcher stopped answering" in headline, err
        assert f"lost its connection to {hosts.addrs[1]}" in headline, err
        assert "after it: rank " in err, err
        assert first["after"]["kind"] == "rank" and first["after"]["node_rank"] == 0, first
        assert hosts.addrs[1] in first["after"]["message"], first
    else:
        assert "node 0 serves the job's rendezvous, so the job ends on every node." in headline, err
    hosts.assert_empty()
