"""Every listening socket of a job binds the job's address, never every interface.

The addresses come from the kernel: the socket inodes each process of the job holds
(``/proc/<pid>/fd``) matched with the listening sockets in that process's network namespace
(``/proc/<pid>/net/tcp`` and ``tcp6``), read while the job runs.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from conftest import free_port
from support import JOB, Hosts, Launch, netns_unavailable, wait_for_files

_LISTEN = "0A"


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    todo += [int(p) for p in fh.read().split()]
            except OSError:
                pass
    return found


def _address(hexaddr: str) -> tuple[str, int]:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN that ``pid`` or a descendant holds."""
    result = set()
    for proc in _descendants(pid):
        inodes = set()
        try:
            for fd in os.listdir(f"/proc/{proc}/fd"):
                target = os.readlink(f"/proc/{proc}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{proc}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == _LISTEN and fields[9] in inodes:
                    result.add(_address(fields[1]))
    return result


@pytest.mark.slow
def test_a_single_node_job_listens_on_loopback_only(tmp_path: Path) -> None:
    port = free_port()
    release = tmp_path / "release"
    job = Launch(tmp_path, "--device-num", "2", "--port", str(port), str(JOB), "--hold", str(release))
    try:
        wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
        found = listening(job.proc.pid)
    finally:
        release.touch()
    assert job.wait() == 0, job.err
    assert (("127.0.0.1", port)) in found  # MASTER_PORT's store, served by the launcher
    assert {addr for addr, _ in found} == {"127.0.0.1"}, found


@pytest.mark.slow
def test_a_two_node_job_on_loopback_listens_on_loopback_only(tmp_path: Path) -> None:
    port = free_port()
    release = tmp_path / "release"
    nodes = [Launch(tmp_path, "--nnodes", "2", "--node-rank", str(rank), "--device-num", "1", "--addr", "127.0.0.1",
                    "--port", str(port), "--join-timeout", "300", str(JOB), "--hold", str(release), name=f"node{rank}")
             for rank in (0, 1)]
    try:
        wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
        found = [listening(node.proc.pid) for node in nodes]
    finally:
        release.touch()
    for node in nodes:
        assert node.wait() == 0, node.err
    assert {("127.0.0.1", port), ("127.0.0.1", port + 1)} <= found[0]
    assert {addr for addr, _ in found[0] | found[1]} == {"127.0.0.1"}, found


_WHY = netns_unavailable()


@pytest.mark.long
@pytest.mark.skipif(_WHY is not None, reason=_WHY or "")
def test_a_two_host_job_listens_on_each_hosts_job_address(tmp_path: Path) -> None:
    hosts = Hosts(2)
    try:
        release = tmp_path / "release"
        nodes = [Launch(tmp_path, "--nnodes", "2", "--node-rank", str(rank), "--device-num", "1", "--addr",
                        hosts.addrs[0], "--port", "29400", "--join-timeout", "120", str(JOB), "--hold", str(release),
                        name=f"node{rank}", netns=hosts.names[rank], env_drop=("GLOO_SOCKET_IFNAME",))
                 for rank in (0, 1)]
        try:
            wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
            found = [listening(node.proc.pid) for node in nodes]
        finally:
            release.touch()
        for node in nodes:
            assert node.wait() == 0, node.err
        assert {(hosts.addrs[0], 29400), (hosts.addrs[0], 29401)} <= found[0]
        assert {addr for addr, _ in found[0]} == {hosts.addrs[0]}, found
        assert {addr for addr, _ in found[1]} <= {hosts.addrs[1]}, found
    finally:
        hosts.remove()


def test_an_address_routed_here_binds_the_interface_that_reaches_it() -> None:
    """An AscendJob's MASTER_ADDR is a Service IP: not this host's, but forwarded to it."""
    from npu_migrate.launch.nodes import servers
    from npu_migrate.launch.setup import cluster

    remote = "198.51.100.7"  # TEST-NET-2: never this host's; only the routing table is asked
    way = cluster.interface_for(remote)
    if way is None:
        pytest.skip("this host has no route to a documentation address")
    sock = servers.bind(remote, 0)
    try:
        assert sock.getsockname()[0] == way[1]
        assert sock.getsockname()[0] not in ("0.0.0.0", "::")
    finally:
        sock.close()
