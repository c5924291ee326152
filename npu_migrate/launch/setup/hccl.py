"""HCCL's host ports and the HCCL variables that every node of a job must share.

Usage::

    ports = host_ports(os.environ)       # PortRange: 60000-60015 unless the user moved it
    8000 in ports                        # False
    ports.describe()                     # "60000-60015 (HCCL_IF_BASE_PORT unset: HCCL's default)"
    agreed_values(os.environ)            # {"HCCL_CONNECT_TIMEOUT": "600", "HCCL_EXEC_TIMEOUT": "", ...}

**Ports.** HCCL listens on host ports to exchange its ranks' information (CANN's environment
variable reference, "HCCL_IF_BASE_PORT" and "HCCL_HOST_SOCKET_PORT_RANGE"):

- ``HCCL_IF_BASE_PORT`` (an integer in 1024-65520): HCCL takes :data:`PORTS_PER_BASE` ports from
  it; unset, ports 60000-60015 (the reference asks admins to reserve exactly that range with
  ``net.ipv4.ip_local_reserved_ports``).
- ``HCCL_HOST_SOCKET_PORT_RANGE``: ports and ranges separated by commas (``60000-60050``,
  ``60000,60050-60100``) or ``auto`` (the OS picks); it wins over ``HCCL_IF_BASE_PORT`` when set.
- ``HCCL_NPU_SOCKET_PORT_RANGE`` (same format) names ports on the NPUs' own network interfaces,
  not the host's, so it cannot collide with the launcher's ports and is not checked.

The launcher's master port, its control port (``--port + 1``) and every port it picks itself stay
outside the host range: a port it picks is drawn again, a port the user gives is refused on the npu
family (:func:`npu_migrate.launch.setup.config.make_config`). On other families nothing of HCCL runs, so
a given port is accepted; ports the launcher picks avoid the range everywhere, which costs nothing.

**Variables that must agree** (:data:`AGREED_VARS`): each node's values travel in the rendezvous'
``shape`` record (:mod:`..nodes.membership`); the first node's values are the job's and a node with others
ends the job with one line naming the variable and both values. They are compared on every family:
a difference is a mistake in the job's set-up even where HCCL does not read them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from npu_migrate.launch.errors import LaunchUsageError

BACKEND = "hccl"
"""The torch.distributed backend whose host ports this module keeps the launcher out of."""

DEFAULT_BASE_PORT = 60000
"""HCCL's first host port when ``HCCL_IF_BASE_PORT`` is unset."""

PORTS_PER_BASE = 16
"""Host ports HCCL takes from its base port (60000-60015 by default)."""

BASE_PORT_LIMITS = (1024, 65520)
"""The values ``HCCL_IF_BASE_PORT`` accepts (65520 + 15 is the last port)."""

_SPAN = re.compile(r"(\d+)(?:\s*-\s*(\d+))?")

BASE_PORT_ENV = "HCCL_IF_BASE_PORT"
HOST_RANGE_ENV = "HCCL_HOST_SOCKET_PORT_RANGE"
NPU_RANGE_ENV = "HCCL_NPU_SOCKET_PORT_RANGE"

AGREED_VARS: dict[str, str] = {
    "HCCL_CONNECT_TIMEOUT": "how long a rank waits for its peers while the communicator forms; a node "
                            "with a shorter one gives up first and its error hides the real late node",
    "HCCL_EXEC_TIMEOUT": "how long a collective waits for the other ranks; unequal values make one node "
                         "report a timeout the others do not",
    BASE_PORT_ENV: "a rank-table job computes each peer's listening port from it",
    HOST_RANGE_ENV: "ranks connect to the ports their peers listen on",
    "HCCL_BUFFSIZE": "the communication buffer's size; peers write into each other's buffers",
    "HCCL_INTRA_ROCE_ENABLE": "which link ranks on one server use; both sides must choose the same",
    "HCCL_INTRA_PCIE_ENABLE": "which link ranks on one server use; both sides must choose the same",
    "HCCL_ALGO": "the collective algorithm; every rank must run the same one",
    "HCCL_OP_EXPANSION_MODE": "where collectives are expanded (AI CPU, AIV, host); it changes the algorithm",
    "HCCL_DETERMINISTIC": "deterministic reductions; a mix gives results that differ by node",
}
"""HCCL variables that must be equal on every node of a job, each with the reason."""


@dataclass(frozen=True)
class PortRange:
    """The host ports HCCL may listen on, and what set them.

    Attributes:
        spans: inclusive ``(first, last)`` pairs; empty when the OS picks (``auto``).
        variable: the variable that chose them (the one to change).
        source: how they were chosen, for messages.
    """

    spans: tuple[tuple[int, int], ...]
    variable: str
    source: str

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and any(lo <= port <= hi for lo, hi in self.spans)

    def describe(self) -> str:
        spans = ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in self.spans) or "none"
        return f"{spans} ({self.source})"


def parse_port_list(name: str, text: str) -> tuple[tuple[int, int], ...]:
    """``60000,60050-60100`` -> ``((60000, 60000), (60050, 60100))``; ``auto`` -> ``()``.

    Raises:
        ValueError: a value HCCL would not accept, as one line naming the variable.
    """
    text = text.strip()
    if text.lower() == "auto":
        return ()
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        match = _SPAN.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"{name}={text!r} is not a port list: expected ports and ranges separated by "
                             "commas, e.g. 60000-60050 or 60000,60050-60100, or auto.")
        lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"{name}={text!r} has the range {lo}-{hi}: expected ports from 1 to 65535, "
                             "the lower one first.")
        spans.append((lo, hi))
    return tuple(spans)


def host_ports(environ: dict[str, str]) -> PortRange:
    """The host ports HCCL would take with this environment.

    Raises:
        ValueError: an unreadable ``HCCL_HOST_SOCKET_PORT_RANGE`` or ``HCCL_IF_BASE_PORT``.
    """
    given = environ.get(HOST_RANGE_ENV, "").strip()
    if given:
        spans = parse_port_list(HOST_RANGE_ENV, given)
        return PortRange(spans, HOST_RANGE_ENV, f"{HOST_RANGE_ENV}={given}")
    base_text = environ.get(BASE_PORT_ENV, "").strip()
    if not base_text:
        first = DEFAULT_BASE_PORT
        source = f"{BASE_PORT_ENV} unset: HCCL's default"
    else:
        lo, hi = BASE_PORT_LIMITS
        if not base_text.isdigit() or not lo <= int(base_text) <= hi:
            raise ValueError(f"{BASE_PORT_ENV}={base_text!r} is not a port HCCL accepts: expected an integer "
                             f"from {lo} to {hi}.")
        first = int(base_text)
        source = f"{BASE_PORT_ENV}={first}"
    return PortRange(((first, first + PORTS_PER_BASE - 1),), BASE_PORT_ENV, source)


CONNECT_TIMEOUT_ENV = "HCCL_CONNECT_TIMEOUT"
"""How long (seconds) an HCCL rank waits for its peers while the communicator forms (HCCL's default: 120)."""

CONNECT_TIMEOUT_DEFAULT_S = 120
"""HCCL's own default, which holds up to :data:`CONNECT_TIMEOUT_NODES` nodes."""

CONNECT_TIMEOUT_NODES = 64
"""Nodes (8 NPUs each, 512 ranks) that HCCL's default connect window is left for: every rank reaches
the communicator's root and then its link peers while the others still start, so the time to form
grows with the node count, and one node late by more than the window fails the whole job with
EI0006."""

CONNECT_TIMEOUT_MAX_S = 1800
"""The longest default the launcher gives: a communicator that has not formed in 30 minutes will
not, and a longer window only delays the report."""


def connect_timeout(backend: str, nnodes: int, environ: dict[str, str]) -> int | None:
    """The ``HCCL_CONNECT_TIMEOUT`` the launcher sets for ``nnodes`` nodes, or None (HCCL's default
    holds, or the job's ``backend`` is not HCCL).

    ``min(CONNECT_TIMEOUT_MAX_S, CONNECT_TIMEOUT_DEFAULT_S x ceil(nnodes / CONNECT_TIMEOUT_NODES))``
    past :data:`CONNECT_TIMEOUT_NODES` nodes (240 s at 128 nodes, 480 s at 256, 1,800 s at 1,024),
    unless the user set the variable: theirs wins, as does HCCL's default for smaller jobs. Every
    node computes the same value from ``--nnodes``, so the nodes agree (:data:`AGREED_VARS`).
    """
    if backend != BACKEND or environ.get(CONNECT_TIMEOUT_ENV) or nnodes <= CONNECT_TIMEOUT_NODES:
        return None
    return min(CONNECT_TIMEOUT_MAX_S, CONNECT_TIMEOUT_DEFAULT_S * -(-nnodes // CONNECT_TIMEOUT_NODES))


def connect_timeout_note(backend: str, nnodes: int, environ: dict[str, str]) -> str:
    """The start-up line's note where the launcher sets ``HCCL_CONNECT_TIMEOUT`` ("" where it does not)."""
    value = connect_timeout(backend, nnodes, environ)
    return "" if value is None else (f"{CONNECT_TIMEOUT_ENV}={value} for {nnodes} nodes "
                                     f"(unset; HCCL's {CONNECT_TIMEOUT_DEFAULT_S} s is for up to "
                                     f"{CONNECT_TIMEOUT_NODES})")


def agreed_values(environ: dict[str, str]) -> dict[str, str]:
    """This node's value of every :data:`AGREED_VARS` variable ("" where unset)."""
    return {name: environ.get(name, "") for name in AGREED_VARS}


def check_launcher_ports(port: int, control: int | None, port_from: str, ports: PortRange) -> None:
    """Refuse a master or control port inside HCCL's host range (the npu family; see the module docstring).

    Raises:
        LaunchUsageError: one line naming the port, where it came from, the range and its variable.
    """
    mine = [port] + ([control] if control is not None else [])
    inside = [p for p in mine if p in ports]
    if not inside:
        return
    what = "the control port (--port + 1)" if inside[0] != port else "the master port"
    raise LaunchUsageError(
        f"{what} {inside[0]} ({port_from}) is inside HCCL's host port range {ports.describe()}: HCCL listens "
        f"there on every NPU host. Pick a --port outside it, or move HCCL's range with {ports.variable}.")
