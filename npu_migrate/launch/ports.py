"""The job's ports: torchrun's default, the rendezvous store's offset, and a free port outside HCCL's range.

Usage::

    from npu_migrate.launch.ports import CONTROL_PORT_OFFSET, pick_free_port

    port = pick_free_port(hccl.host_ports(os.environ))        # MASTER_PORT of a one-node job
    store_port = port + CONTROL_PORT_OFFSET                   # node 0's rendezvous store (several nodes)
"""

from __future__ import annotations

import socket

from npu_migrate.launch import hccl
from npu_migrate.launch.errors import LaunchError

DEFAULT_PORT = 29500
"""MASTER_PORT when several nodes are launched and no --port is given (torchrun's default)."""

CONTROL_PORT_OFFSET = 1
"""Node 0's launcher serves the rendezvous store on MASTER_PORT + this (multi-node jobs only)."""

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


def pick_free_port(avoid: hccl.PortRange) -> int:
    """A port the OS calls free, outside HCCL's host range (the OS may hand out 60000-60015)."""
    for _ in range(_FREE_PORT_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        if port not in avoid and port + CONTROL_PORT_OFFSET not in avoid:
            return port
    raise LaunchError(f"the OS offered only ports inside HCCL's range {avoid.describe()}: pass --port.")
