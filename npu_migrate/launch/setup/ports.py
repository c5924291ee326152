"""The job's ports: torchrun's default, the rendezvous store's offset, and a free port outside HCCL's range.

Usage::

    from npu_migrate.launch.setup.ports import CONTROL_PORT_OFFSET, pick_free_port, release

    port = pick_free_port(hccl.host_ports(os.environ))        # MASTER_PORT of a one-node job, held
    store_port = port + CONTROL_PORT_OFFSET                   # node 0's rendezvous store (several nodes)
    release(port)                                             # the job is over

**A picked port is held until the job ends.** The OS hands out a ``bind(0)`` port from its
ephemeral range, the range it also takes every outgoing connection's local port from. Between the
pick and the moment the ranks' store listens there (the fork server starts in between: seconds on a
busy host), any connection on the host could take it, and the job would end with "Address already
in use" on a port nobody chose. So the picking socket stays bound, with ``SO_REUSEADDR`` and without
listening: the kernel then gives the port to no other ``bind(0)`` and no outgoing connection, while
the launcher's own listening socket (also ``SO_REUSEADDR``) can still bind it. :func:`release`
closes it.
"""

from __future__ import annotations

import functools
import socket
import threading
from typing import Any, Callable, TypeVar

from npu_migrate.launch.setup import hccl
from npu_migrate.launch.errors import LaunchError

DEFAULT_PORT = 29500
"""MASTER_PORT when several nodes are launched and no --port is given (torchrun's default)."""

CONTROL_PORT_OFFSET = 1
"""Node 0's launcher serves the rendezvous store on MASTER_PORT + this (multi-node jobs only)."""

_F = TypeVar("_F", bound=Callable[..., Any])

_FREE_PORT_TRIES = 64
"""Draws of an OS-chosen port before giving up on one outside HCCL's range (16 of ~28000 ports)."""



def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


_held: dict[int, socket.socket] = {}
_held_lock = threading.Lock()


def pick_free_port(avoid: hccl.PortRange) -> int:
    """A port the OS calls free, outside HCCL's host range (the OS may hand out 60000-60015).

    The port is held for this process until :func:`release` (see the module docstring).
    """
    for _ in range(_FREE_PORT_TRIES):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("", 0))
            # After the bind: bind(0) itself must not pick a port other sockets share.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            port = int(sock.getsockname()[1])
        except BaseException:
            sock.close()
            raise
        if port not in avoid and port + CONTROL_PORT_OFFSET not in avoid:
            with _held_lock:
                _held[port] = sock
            return port
        sock.close()
    raise LaunchError(f"the OS offered only ports inside HCCL's range {avoid.describe()}: pass --port.")


def held() -> frozenset[int]:
    """The ports :func:`pick_free_port` holds for this process now."""
    with _held_lock:
        return frozenset(_held)


def release(*ports: int) -> None:
    """Stop holding ``ports`` (a port this process does not hold is ignored)."""
    with _held_lock:
        socks = [_held.pop(port) for port in ports if port in _held]
    for sock in socks:
        sock.close()


def released_on_error(fn: _F) -> _F:
    """``fn`` holds no port it picked if it raises (a refused job holds none)."""

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        before = held()
        try:
            return fn(*args, **kwargs)
        except BaseException:
            release(*(held() - before))
            raise

    return guarded  # type: ignore[return-value]
