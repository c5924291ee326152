"""The launcher across real hosts: Linux network namespaces joined by veth links, one launcher per host.

Each test makes its own namespaces (addresses in 192.0.2.0/24) and removes them; they need root
and iproute2 and are skipped with the reason elsewhere. The machine's host name resolves to
127.0.0.1 inside them, so the launcher has to find the interface that reaches node 0 itself.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support import (HOSTS_NODE_TIMEOUT, HOSTS_PORT, JOB, Hosts, Launch, host_launcher, hosts,  # noqa: F401 (fixture)
                     netns_unavailable, one_line_errors, reports, wait_for_files, wait_for_text)

_WHY = netns_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

def node(tmp: Path, hosts: Hosts, rank: int, *extra: str, name: str | None = None, nproc: str = "2",
         job: tuple[str, ...] = ()) -> Launch:
    return host_launcher(tmp, hosts, rank, JOB, *extra, name=name, nproc=nproc, job=job)


@pytest.mark.slow  # not long: every torch tier of .ci/run runs one job across hosts (the store server differs)
def test_two_hosts_two_ranks_each(tmp_path: Path, hosts: Hosts) -> None:
    node1 = node(tmp_path, hosts, 1, job=("--sleep", "0"))
    node0 = node(tmp_path, hosts, 0, job=("--sleep", "0"))
    assert node0.wait() == 0, node0.err
    assert node1.wait() == 0, node1.err
    got = reports(tmp_path, 4)
    assert [(r["env"]["NODE_RANK"], r["env"]["LOCAL_RANK"], r["env"]["RANK"]) for r in got] == [
        ("0", "0", "0"), ("0", "1", "1"), ("1", "0", "2"), ("1", "1", "3")]
    assert all(r["sum"] == 10.0 and r["env"]["MASTER_ADDR"] == hosts.addrs[0] for r in got)
    # Loopback would not reach the other host: each node found its link to node 0.
    assert [r["extra_env"]["GLOO_SOCKET_IFNAME"] for r in got] == [f"{hosts.tag}a1"] * 2 + [hosts.link(1)] * 2
    assert f"interface {hosts.link(1)} ({hosts.addrs[1]})" in node1.err
    assert "all 2 nodes joined" in node0.err
    hosts.assert_empty()


@pytest.mark.long
@pytest.mark.parametrize("how", ["link down", "SIGKILL"])
def test_a_lost_node_ends_the_job_on_every_node(tmp_path: Path, hosts: Hosts, how: str) -> None:
    hold = ("--hold", str(tmp_path / "never"))  # ranks sit outside any collective: only launchers notice
    node0 = node(tmp_path, hosts, 0, job=hold)
    node1 = node(tmp_path, hosts, 1, job=hold)
    wait_for_files(tmp_path, [f"holding{r}" for r in range(4)])  # every rank past its last collective
    if how == "SIGKILL":
        node1.proc.kill()
        node1.wait()
    else:
        hosts.cut(1)
        assert node1.wait() == 1
        assert f"lost node 0 ({hosts.addrs[0]}" in node1.err or "lost node 0 (" in node1.err, node1.err
        one_line_errors(node1.err)
    assert node0.wait() == 1
    assert f"lost node 1 (vm ({hosts.addrs[1]})): no heartbeat for {HOSTS_NODE_TIMEOUT} s" in node0.err.replace(
        hosts.names[1], "vm"), node0.err
    one_line_errors(node0.err)
    hosts.assert_empty()


@pytest.mark.long
def test_a_relaunched_node_rejoins_under_max_restarts(tmp_path: Path, hosts: Hosts) -> None:
    release = tmp_path / "release"
    job = ("--hold", str(release))
    node0 = node(tmp_path, hosts, 0, "--max-restarts", "1", "--log-dir", str(tmp_path / "logs"), job=job)
    node1 = node(tmp_path, hosts, 1, "--max-restarts", "1", job=job)
    wait_for_files(tmp_path, [f"rank{r}.json" for r in range(4)])
    node1.proc.kill()
    node1.wait()
    wait_for_text(node0.stderr, "restarting the job (restart 1 of 1)")
    again = node(tmp_path, hosts, 1, "--max-restarts", "1", name="node1-again", job=job)
    # Every rank of the second generation has joined its group and reported.
    from support import wait_until
    import json

    def restarted() -> bool:
        try:
            return all(json.loads((tmp_path / f"rank{r}.json").read_text())["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"
                       for r in range(4))
        except (OSError, ValueError):
            return False

    try:
        wait_until(restarted, "every rank restarted once")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{node0.err}\n{again.err}") from None
    release.touch()
    assert node0.wait() == 0, node0.err
    assert again.wait() == 0, again.err
    assert "lost node 1" in node0.err
    assert [r["sum"] for r in reports(tmp_path, 4)] == [10.0] * 4
    hosts.assert_empty()


@pytest.mark.long
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_on_a_node_waiting_to_join(tmp_path: Path, hosts: Hosts, sig: int, code: int) -> None:
    logs = tmp_path / "logs"
    # Three nodes are expected and only two come: node 1 waits in the rendezvous.
    extra = ("--log-dir", str(logs))
    args = lambda rank: ["--nnodes", "3", "--node-rank", str(rank), "--device-num", "1", "--addr", hosts.addrs[0],  # noqa: E731
                         "--port", HOSTS_PORT, "--join-timeout", "300", "--node-timeout", HOSTS_NODE_TIMEOUT, *extra, str(JOB)]
    node0 = Launch(tmp_path, *args(0), name="node0", netns=hosts.names[0], env_drop=("GLOO_SOCKET_IFNAME",))
    node1 = Launch(tmp_path, *args(1), name="node1", netns=hosts.names[1], env_drop=("GLOO_SOCKET_IFNAME",))
    wait_for_text(logs / "launcher-node1.log", "node 1: waiting for nodes")
    node1.proc.send_signal(sig)
    assert node1.wait() == code
    assert node1.err.strip().splitlines()[-1] == (
        f"npu-migrate launch: received {signal.Signals(sig).name} while waiting for nodes: stopped; "
        "no rank is left running on node 1.")
    one_line_errors(node1.err)
    node0.proc.send_signal(sig)
    assert node0.wait() == code
    one_line_errors(node0.err)
    assert not list(tmp_path.glob("rank*.json"))
    hosts.assert_empty()


@pytest.mark.long
def test_a_host_whose_resolver_does_not_answer_is_told_apart_from_one_whose_host_file_names_it(hosts: Hosts) -> None:
    """What decides whether torch 2.5's store server would stop the launcher (servers.check_name_lookup),
    read on a real resolver: inside a namespace no DNS server answers, and /etc/hosts names the hosts."""
    code = ("from npu_migrate.launch.nodes import servers as s; "
            f"print(s.name_lookup_failure({hosts.addrs[0]!r})); print(s.name_lookup_failure(s.PROBE_ADDRESS))")
    got = subprocess.run(["ip", "netns", "exec", hosts.names[0], sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60)
    named, probe = got.stdout.splitlines()
    assert named == "None", got
    assert probe.startswith("looking up 198.51.100.1: "), got
