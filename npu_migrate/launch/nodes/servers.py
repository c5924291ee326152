"""The launcher's TCPStore servers, each listening on the job's address only, never on every interface.

Usage::

    server = serve("10.0.0.1", 29501, timeout=600)   # node 0's launcher store (--port + 1)
    ranks = RankStore(cfg)                           # node 0: MASTER_PORT's store, for the workers
    ranks.restart()                                  # a fresh one before each start of the ranks
    ranks.close()

**Binding.** A ``TCPStore`` server binds every interface (``::`` or ``0.0.0.0``) whatever host
name it is given. :func:`serve` binds a socket itself to the job's address (``--addr`` on node
0, which the launcher checked is this host's; loopback for a single node) and hands it to
torch with ``master_listen_fd`` (torch 2.1 and later; torch owns the descriptor from then on).

**Backend.** torch 2.4 made libuv the default ``TCPStore`` server, and libuv's server takes a
listening descriptor only from torch 2.8 (pytorch/pytorch#150215): on torch 2.4 to 2.7 it refuses
one ("The libuv TCPStore backend does not support initialization with an listen fd"), and binding by
port instead would listen on every interface. There :func:`serve` asks for the classic backend
(``use_libuv=False``, which takes the descriptor on every torch); elsewhere it keeps torch's default,
or the classic backend under ``USE_LIBUV=0`` (:func:`server_options`). Only the server differs:
clients speak the same protocol to both.

**MASTER_PORT.** torch's ``env://`` rendezvous would make rank 0 serve ``MASTER_PORT`` on every
interface. Instead node 0's launcher serves it (:class:`RankStore`) and every worker is a client:
the workers get ``TORCHELASTIC_USE_AGENT_STORE=True``, torchrun's own switch for an
agent-hosted store, which ``torch.distributed.rendezvous._create_c10d_store`` reads (torch 2.1:
every rank a client under ``PrefixStore("/worker/attempt_<restart>")``; newer torch: every rank
a client without a prefix, when MASTER_ADDR:MASTER_PORT is the endpoint). As torchrun does, the
launcher serves a new store for every start of the ranks, so no key of an earlier attempt (or
of ``--preflight``) is left for the next. torch >= 2.4 also lets a script's own
``TCPStore(MASTER_ADDR, MASTER_PORT, is_master=True)`` share it; on older torch such a script
must use another port (docs/security.md).
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import os
import socket
from datetime import timedelta
from typing import Any

from packaging.version import Version

from npu_migrate.launch.errors import LaunchError
from npu_migrate.launch.setup import cluster, software

logger = logging.getLogger(__name__)

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""Set to ``"True"`` in every worker: the launcher serves MASTER_PORT (torch's own switch)."""

_BACKLOG = 1024
"""Pending connections the listening socket queues (every rank of a large job connects at once)."""


def bind(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on ``addr:port`` (the first of its addresses this host has).

    Where ``addr`` is not this host's but traffic to it arrives here (a MindCluster AscendJob's
    ``MASTER_ADDR`` is the master pod's Service IP, which Kubernetes forwards to the pod's own
    address), the socket binds the address of the interface that routes to ``addr``: still one
    interface, never all of them.

    Raises:
        OSError: no address of ``addr`` (or of the way to it) can be bound, or the port is taken.
    """
    try:
        return _bind_first(addr, port)
    except OSError as exc:
        if exc.errno != errno.EADDRNOTAVAIL:
            raise
        found = cluster.interface_for(addr)
        if found is None:
            raise
        logger.debug("%s is not this host's; listening on %s (%s), the way to it", addr, found[1], found[0])
        return _bind_first(found[1], port)


def _bind_first(addr: str, port: int) -> socket.socket:
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does
            sock.bind(sockaddr)
            sock.listen(_BACKLOG)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"{addr} has no address")


LIBUV_DEFAULT = (2, 4)
"""The first torch whose ``TCPStore`` server is libuv's unless ``use_libuv=False`` is given."""
LIBUV_TAKES_FD = (2, 8)
"""The first torch whose libuv store server listens on a descriptor it is given (pytorch/pytorch#150215)."""


def server_options(torch_version: str | None = None, use_libuv: str | None = None) -> dict[str, Any]:
    """The ``TCPStore`` keywords that pick a server backend able to take ``master_listen_fd``.

    ``{"use_libuv": False}`` where libuv is the default backend but cannot take a descriptor
    (torch 2.4 to 2.7); ``{}`` where the default can: the classic backend (torch < 2.4, where
    ``use_libuv`` defaults to False) or libuv (torch >= 2.8), kept there because it is torch's
    choice for large jobs (thousands of ranks connecting at once). ``USE_LIBUV=0``
    (``use_libuv``, default: the environment's), torch's own switch back to the classic backend
    for the stores ``env://`` and torchrun serve, picks it on torch >= 2.8 too.
    """
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    if use_libuv is None:
        use_libuv = os.environ.get("USE_LIBUV")
    release = Version(torch_version).release[:2]
    if release < LIBUV_DEFAULT:
        return {}
    return {"use_libuv": False} if release < LIBUV_TAKES_FD or use_libuv == "0" else {}


CONNECT_MIN_S = 1.0
"""The shortest timeout a store connection is made with. torch 2.1's ``TCPStore`` counts its connect
timeout in whole seconds: under 1 s it gives up before its first try ("The client socket has timed
out after 0s"), against a server that is up. So a wait's own connection made with less than a second
of the wait left, or a window shorter than a second, connects within a second; the wait itself keeps
its own timeout (``wait`` takes fractions of a second on every torch)."""


def _timeout(seconds: float) -> timedelta:
    return timedelta(seconds=max(seconds, CONNECT_MIN_S))


NAME_LOOKUP_ABORTS = ((2, 5), (2, 6))
"""The torch releases (from, before) whose classic ``TCPStore`` server aborts its process (C++
``std::terminate``, "failed to format addr, unknown family=0") on the first connection whose
address it cannot look up: each accepted socket's peer is formatted with ``getnameinfo``, and a
lookup that fails (EAI_AGAIN: no DNS server answers, as on an isolated cluster) leaves an address
family of 0 that the formatter throws on, in the server's thread. Seen on torch 2.5.1 in a network
namespace whose resolver answers nothing; torch 2.1, 2.4, 2.6 and 2.14 print the address instead."""

PROBE_ADDRESS = "198.51.100.1"
"""A documentation address (TEST-NET-2) no host file names: its reverse lookup reaches the resolver."""


def name_lookup_failure(address: str) -> str | None:
    """Why looking up the name of ``address`` fails here, or None.

    ``getnameinfo`` without ``NI_NAMEREQD`` gives the numeric address where a name is unknown; it
    fails only where the resolver itself fails (no host file names the address and no DNS server
    answers), which is what stops :data:`NAME_LOOKUP_ABORTS`' server.
    """
    try:
        socket.getnameinfo((address, 0), socket.NI_NUMERICSERV)
    except (OSError, ValueError) as exc:
        return f"looking up {address}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
    return None


def check_name_lookup(addr: str, torch_version: str | None = None) -> None:
    """On :data:`NAME_LOOKUP_ABORTS`' releases (whose store server is always the classic one here,
    :func:`server_options`), for a server other hosts can reach: refuse where its own first
    connection, from ``addr``, would stop the launcher; warn (once) where only addresses no host file
    names would. A loopback address is left alone: only this host connects to it.

    Raises:
        LaunchError: ``addr``'s name cannot be looked up on such a release.
    """
    version = torch_version or software.torch_release()
    low, high = NAME_LOOKUP_ABORTS
    if not low <= Version(version).release[:2] < high or _loopback(addr):
        return
    failure = name_lookup_failure(addr)
    if failure is not None:
        raise LaunchError(f"{_aborts(version)}, and this host cannot look up its own ({failure}): list the "
                          "nodes' addresses in /etc/hosts, make a DNS server reachable, or use torch 2.6 or newer.")
    _warn_if_resolver_silent(version)


def _aborts(version: str) -> str:
    return f"torch {version}'s store server stops the launcher at the first connection whose address it cannot look up"


@functools.cache  # once per launcher: it serves a store for its peers and one for the ranks at every start
def _warn_if_resolver_silent(version: str) -> None:
    failure = name_lookup_failure(PROBE_ADDRESS)
    if failure is not None:
        logger.warning("%s, and this host's resolver does not answer (%s): every node's address must be in "
                       "/etc/hosts here, or use torch 2.6 or newer", _aborts(version), failure)


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:  # a host name: checked
        return False


def serve(addr: str, port: int, timeout: float) -> Any:
    """A TCPStore server listening on ``addr:port`` only (see the module docstring).

    Raises:
        LaunchError: this torch's server would abort at its first connection here (:func:`check_name_lookup`).
        OSError: the address is not this host's, or the port is taken.
    """
    from torch.distributed import TCPStore

    check_name_lookup(addr)
    sock = bind(addr, port)
    try:
        return TCPStore(addr, port, None, True, _timeout(timeout), wait_for_workers=False,
                        master_listen_fd=sock.fileno(), **server_options())
    finally:
        sock.detach()  # the store owns (and closes) the descriptor now, or closed it on failure


def client(addr: str, port: int, timeout: float) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(addr, port, None, False, _timeout(timeout))


class RankStore:
    """Node 0's launcher serves MASTER_PORT's store for every rank of the job (see the module docstring)."""

    def __init__(self, addr: str, port: int, timeout: float = 3600.0) -> None:
        self.addr = addr
        self.port = port
        self.timeout = timeout
        self.store: Any = None

    def restart(self) -> None:
        """Serve a new, empty store on MASTER_PORT (before the ranks, or the pre-flight, start).

        Raises:
            OSError: the address is not this host's, or the port is taken.
        """
        self.close()
        self.store = serve(self.addr, self.port, self.timeout)

    def close(self) -> None:
        """Stop serving (every rank that uses it has exited)."""
        self.store = None
