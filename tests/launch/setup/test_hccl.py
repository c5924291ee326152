"""HCCL's host ports kept clear of the launcher's, and HCCL variables that every node must share."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, ROOT, child_env, free_port
from support import HANG_GUARD_S, JOB, Launch, one_line_errors

from npu_migrate.launch.nodes import servers

from npu_migrate.launch.setup import hccl, ports
from npu_migrate.launch.setup.config import make_config, pick_free_port
from npu_migrate.launch.errors import LaunchError, LaunchUsageError


def test_hccl_host_ports_by_default_and_as_the_user_moves_them() -> None:
    assert hccl.host_ports({}).spans == ((60000, 60015),)
    assert 60015 in hccl.host_ports({}) and 60016 not in hccl.host_ports({}) and 59999 not in hccl.host_ports({})
    assert hccl.host_ports({"HCCL_IF_BASE_PORT": "50000"}).spans == ((50000, 50015),)
    moved = hccl.host_ports({"HCCL_IF_BASE_PORT": "50000", "HCCL_HOST_SOCKET_PORT_RANGE": "60000,60050-60100"})
    assert moved.spans == ((60000, 60000), (60050, 60100)) and moved.variable == "HCCL_HOST_SOCKET_PORT_RANGE"
    assert hccl.host_ports({"HCCL_HOST_SOCKET_PORT_RANGE": "auto"}).spans == ()


@pytest.mark.parametrize(("env", "message"), [
    ({"HCCL_IF_BASE_PORT": "80"}, "HCCL_IF_BASE_PORT='80' is not a port HCCL accepts: expected an integer from 1024 to 65520."),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-"}, "HCCL_HOST_SOCKET_PORT_RANGE='60000-' is not a port list"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "600-500"}, "has the range 600-500: expected ports from 1 to 65535"),
])
def test_unreadable_hccl_port_settings_are_refused(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        hccl.host_ports(env)


NOTHING = hccl.PortRange((), "HCCL_HOST_SOCKET_PORT_RANGE", "auto")


def test_ports_the_launcher_picks_are_never_in_hccls_range() -> None:
    port = pick_free_port(NOTHING)
    ports.release(port)
    assert 1 <= port <= 65535
    everything = hccl.PortRange(((1, 65535),), "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_HOST_SOCKET_PORT_RANGE=1-65535")
    held = ports.held()
    with pytest.raises(LaunchError, match="the OS offered only ports inside HCCL's range 1-65535"):
        pick_free_port(everything)
    assert ports.held() == held


def test_a_picked_port_is_the_jobs_until_it_ends() -> None:
    """Between the pick and the ranks' store, no other socket on the host can take the port.

    (Neither can the kernel's own choices, ``bind(0)`` and outgoing connections, which skip a bound
    port: not something a test can force.)"""
    port = pick_free_port(NOTHING)
    try:
        assert port in ports.held()
        with socket.socket() as other, pytest.raises(OSError, match="Address already in use"):
            other.bind(("127.0.0.1", port))
        server = servers.serve("127.0.0.1", port, 30)  # the launcher's own store listens there
        worker = servers.client("127.0.0.1", port, 30)
        worker.set("rank0", "ready")
        assert server.get("rank0") == b"ready"
        del worker, server
    finally:
        ports.release(port)
    assert port not in ports.held()
    with socket.socket() as after:
        after.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        after.bind(("127.0.0.1", port))


def test_a_refused_job_holds_no_port() -> None:
    held = ports.held()
    with pytest.raises(LaunchUsageError, match="is more than"):
        make_config(nproc=100_000, device="cpu", environ={})
    assert ports.held() == held


def dry_run(*args: str, npu: bool = True, **env: str) -> subprocess.CompletedProcess:
    paths = (FAKE_NPU,) if npu else ()
    return subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--dry-run", *args, str(JOB)],
                          env=child_env(*paths, **env), cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.slow
@pytest.mark.fake_npu
def test_a_port_inside_hccls_range_is_refused_on_the_npu_family() -> None:
    result = dry_run("--device-num", "1", "--port", "60005")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "npu-migrate launch: error: the master port 60005 (--port 60005) is inside HCCL's host port range "
        "60000-60015 (HCCL_IF_BASE_PORT unset: HCCL's default): HCCL listens there on every NPU host. Pick a "
        "--port outside it, or move HCCL's range with HCCL_IF_BASE_PORT."]
    # The control port of a multi-node job too, and the range the user set.
    result = dry_run("--device-num", "1", "--nnodes", "2", "--node-rank", "1", "--addr", "127.0.0.1",
                     "--port", "50015", HCCL_HOST_SOCKET_PORT_RANGE="50016-50020")
    assert result.returncode == 2
    assert ("the control port (--port + 1) 50016 (--port 50015) is inside HCCL's host port range 50016-50020 "
            "(HCCL_HOST_SOCKET_PORT_RANGE=50016-50020)") in result.stderr
    assert "move HCCL's range with HCCL_HOST_SOCKET_PORT_RANGE." in result.stderr
    # A port a scheduler gives is named as such.
    result = dry_run("--device-num", "1", RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                     MINDX_TASK_ID="t", MASTER_ADDR="127.0.0.1", MASTER_PORT="60001")
    assert result.returncode == 2 and "(MindCluster AscendJob's 60001)" in result.stderr, result.stderr
    # Outside the range, or with HCCL moved elsewhere, the same port is fine.
    assert dry_run("--device-num", "1", "--port", "60005", HCCL_IF_BASE_PORT="50000").returncode == 0


@pytest.mark.slow
def test_other_families_accept_a_port_in_hccls_range() -> None:
    result = dry_run("--device-num", "1", "--port", "60005", npu=False)
    assert result.returncode == 0, result.stderr
    assert "master 127.0.0.1:60005" in result.stdout


@pytest.mark.slow
def test_hccl_variables_that_differ_between_nodes_end_the_job_naming_both_values(tmp_path: Path) -> None:
    port = free_port()
    nodes = [Launch(tmp_path, "--nnodes", "2", "--node-rank", str(r), "--device-num", "1", "--addr", "127.0.0.1",
                    "--port", str(port), "--join-timeout", "300", "--node-timeout", "10", str(JOB), name=f"node{r}",
                    HCCL_CONNECT_TIMEOUT=timeout, HCCL_EXEC_TIMEOUT="1800")
             for r, timeout in ((0, "120"), (1, "600"))]
    for node in nodes:
        assert node.wait() == 1, node.err
        one_line_errors(node.err)
        # Whichever node wrote the job's values first, the other one is named with both.
        assert ("has HCCL_CONNECT_TIMEOUT=600 but the job has HCCL_CONNECT_TIMEOUT=120" in node.err
                or "has HCCL_CONNECT_TIMEOUT=120 but the job has HCCL_CONNECT_TIMEOUT=600" in node.err), node.err
        assert "HCCL needs the same value on every node; set it alike everywhere (or nowhere)." in node.err
    assert not list(tmp_path.glob("rank*.json"))


def test_an_unreadable_hccl_base_port_is_refused_in_one_line() -> None:
    result = dry_run("--device-num", "1", npu=False, HCCL_IF_BASE_PORT="80")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "npu-migrate launch: error: HCCL_IF_BASE_PORT='80' is not a port HCCL accepts: expected an integer from 1024 "
        "to 65520. Fix or unset it."]


def test_hccl_connect_timeout_grows_with_the_node_count_where_the_user_left_it_unset() -> None:
    # HCCL's own 120 s up to 64 nodes; 120 s more for every 64 nodes; 30 minutes at most.
    assert [hccl.connect_timeout("hccl", n, {}) for n in (1, 64, 65, 128, 256, 1024, 4096)] == [
        None, None, 240, 240, 480, 1800, 1800]
    assert hccl.connect_timeout("hccl", 1024, {"HCCL_CONNECT_TIMEOUT": "600"}) is None  # the user's value wins
    assert hccl.connect_timeout_note("hccl", 64, {}) == ""
    assert hccl.connect_timeout_note("hccl", 256, {}).startswith("HCCL_CONNECT_TIMEOUT=480 for 256 nodes")
    assert hccl.connect_timeout("gloo", 1024, {}) is None and hccl.connect_timeout_note("gloo", 1024, {}) == ""


def test_a_large_hccl_jobs_ranks_get_the_scaled_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate.launch.setup.config import LaunchConfig

    monkeypatch.delenv("HCCL_CONNECT_TIMEOUT", raising=False)
    assert LaunchConfig(nproc=8, nnodes=256, backend="hccl").worker_env(0)["HCCL_CONNECT_TIMEOUT"] == "480"
    assert "HCCL_CONNECT_TIMEOUT" not in LaunchConfig(nproc=8, nnodes=16, backend="hccl").worker_env(0)
    assert "HCCL_CONNECT_TIMEOUT" not in LaunchConfig(nproc=8, nnodes=256, backend="gloo").worker_env(0)
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "900")  # the ranks inherit the user's own
    assert "HCCL_CONNECT_TIMEOUT" not in LaunchConfig(nproc=8, nnodes=256, backend="hccl").worker_env(0)
