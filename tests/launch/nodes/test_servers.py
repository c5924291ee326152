"""The launcher's store servers on the running torch: the backend each torch gets, listening on the
socket the launcher bound (the job's address only), a client's round trip.

Each branch of :func:`servers.server_options` has a test that runs on the torch tier taking it:
torch 2.1 (before libuv was the default), torch 2.7.1 (libuv the default, unable to take a
descriptor) and torch 2.14 (libuv takes it; ``USE_LIBUV=0`` picks the classic backend).
"""

from __future__ import annotations

import socket

import pytest
import torch
from packaging.version import Version

from conftest import free_port

from npu_migrate.launch.errors import LaunchError
from npu_migrate.launch.nodes import servers

RELEASE = Version(torch.__version__).release[:2]
BEFORE_LIBUV = RELEASE < servers.LIBUV_DEFAULT
LIBUV_WITHOUT_FD = servers.LIBUV_DEFAULT <= RELEASE < servers.LIBUV_TAKES_FD
LIBUV_WITH_FD = RELEASE >= servers.LIBUV_TAKES_FD


@pytest.mark.parametrize(("torch_version", "use_libuv", "options"), [
    ("2.1.0", None, {}),
    ("2.3.1", "0", {}),
    ("2.4.0", None, {"use_libuv": False}),
    ("2.7.1+cpu", "1", {"use_libuv": False}),
    ("2.8.0", None, {}),
    ("2.8.0", "0", {"use_libuv": False}),
    ("2.14.0+cu130", "1", {}),
])
def test_the_store_backend_each_torch_gets(torch_version: str, use_libuv: str | None, options: dict) -> None:
    assert servers.server_options(torch_version, use_libuv) == options


def _serves_on_loopback_only(monkeypatch: pytest.MonkeyPatch, use_libuv: str | None = None) -> object:
    """Serve on 127.0.0.1; a client round trip there; nothing listens on 127.0.0.2 (also loopback,
    reached by a server bound to every interface). Returns the server."""
    if use_libuv is None:
        monkeypatch.delenv("USE_LIBUV", raising=False)
    else:
        monkeypatch.setenv("USE_LIBUV", use_libuv)
    port = free_port()
    server = servers.serve("127.0.0.1", port, timeout=30)
    client = servers.client("127.0.0.1", port, timeout=30)
    client.set("job/key", "value")
    assert server.get("job/key") == b"value"
    with socket.socket() as other, pytest.raises(ConnectionRefusedError):
        other.connect(("127.0.0.2", port))
    return server


@pytest.mark.skipif(not BEFORE_LIBUV, reason=f"torch {torch.__version__}: libuv is the default store backend")
def test_before_torch_2_4_the_default_backend_takes_the_launchers_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _serves_on_loopback_only(monkeypatch)
    assert not getattr(server, "libuvBackend", False)


@pytest.mark.skipif(not LIBUV_WITHOUT_FD, reason=f"torch {torch.__version__} is not 2.4 to 2.7")
def test_on_torch_2_4_to_2_7_the_classic_backend_takes_the_launchers_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore

    # The reason: torch's default backend (libuv) refuses a listening socket on these releases.
    with servers.bind("127.0.0.1", 0) as sock:
        with pytest.raises(Exception, match="libuv TCPStore backend does not support initialization with an listen fd"):
            TCPStore("127.0.0.1", sock.getsockname()[1], None, True, timedelta(seconds=30), wait_for_workers=False,
                     master_listen_fd=sock.fileno())
    server = _serves_on_loopback_only(monkeypatch, use_libuv="1")  # USE_LIBUV=1 cannot change that
    assert server.libuvBackend is False


@pytest.mark.skipif(not LIBUV_WITH_FD, reason=f"torch {torch.__version__}: libuv cannot take a listening socket")
def test_from_torch_2_8_libuv_takes_the_launchers_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _serves_on_loopback_only(monkeypatch).libuvBackend is True


@pytest.mark.skipif(not LIBUV_WITH_FD, reason=f"torch {torch.__version__}: libuv cannot take a listening socket")
def test_from_torch_2_8_use_libuv_0_picks_the_classic_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _serves_on_loopback_only(monkeypatch, use_libuv="0").libuvBackend is False


def test_a_connection_made_with_under_a_second_left_connects() -> None:
    # torch 2.1 counts a client's connect timeout in whole seconds: under 1 s it gave up at once
    # ("timed out after 0s"), which ended an elastic rendezvous's last call (node 0 waited for more
    # nodes with a connection made when a fraction of a second was left).
    port = free_port()
    server = servers.serve("127.0.0.1", port, timeout=0.4)
    client = servers.client("127.0.0.1", port, timeout=0.001)
    client.set("job/key", "value")
    assert server.get("job/key") == b"value"


def _lookups_fail_for(monkeypatch: pytest.MonkeyPatch, *failing: str) -> None:
    """getnameinfo as a resolver that fails for ``failing`` and knows no name for the others."""
    def getnameinfo(sockaddr: tuple, flags: int) -> tuple:
        if sockaddr[0] in failing:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return sockaddr[0], str(sockaddr[1])

    monkeypatch.setattr(socket, "getnameinfo", getnameinfo)


def test_torch_2_5_is_refused_in_one_line_where_its_store_server_would_stop_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _lookups_fail_for(monkeypatch, "10.0.0.1", "127.0.0.1", servers.PROBE_ADDRESS)
    with pytest.raises(LaunchError) as refused:
        servers.check_name_lookup("10.0.0.1", "2.5.1")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("torch 2.5.1's store server stops the launcher")
    assert "(looking up 10.0.0.1: Temporary failure in name resolution)" in message and "/etc/hosts" in message
    for other in ("2.1.0", "2.4.0", "2.6.0", "2.14.0"):  # their servers print an address they cannot name
        servers.check_name_lookup("10.0.0.1", other)
    servers.check_name_lookup("127.0.0.1", "2.5.1")  # only this host connects to a loopback store


def test_torch_2_5_warns_once_where_only_addresses_no_host_file_names_would_stop_it(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _lookups_fail_for(monkeypatch, servers.PROBE_ADDRESS)
    with caplog.at_level("WARNING", logger=servers.__name__):
        for _ in range(2):  # the launcher's store, then the ranks' store
            servers.check_name_lookup("10.0.0.2", "2.5.0")
    (record,) = caplog.records
    assert "every node's address must be in /etc/hosts here" in record.getMessage()
