"""What to check next, for a signal or a known backend error: the failure report's one-line hints.

Usage::

    signal_hint("SIGKILL")      # "often the kernel's out-of-memory killer, or an external kill: ..."
    error_hint(traceback_text)  # "gloo could not find the interface: set GLOO_SOCKET_IFNAME ..." or None
    after_a_peer(traceback_text)  # True for "Connection closed by peer": a consequence, not the cause

Both are tables (data, not if-chains): add a row to teach the report a new case. An error
signature is a regular expression searched in the exception's message and traceback; the first
row that matches wins, so specific rows come before general ones. HCCL rows quote what Huawei's
documentation says each code is; nothing here guesses at a code's meaning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PEER_DIED = r"NCCL communicator was aborted|ncclRemoteError|remote process exited"
"""A backend error that says another rank died first (NCCL)."""
PEER_CLOSED = r"Connection (reset|closed) by peer|Broken pipe"
"""A backend error that says a peer's connection went away (gloo, TCPStore): it failed first, most often."""
_AFTER_A_PEER = re.compile(f"{PEER_DIED}|{PEER_CLOSED}")

SIGNAL_HINTS: dict[str, str] = {
    "SIGKILL": ("often the kernel's out-of-memory killer, or an external kill (a scheduler, a user): check "
                "`dmesg` or `journalctl -k`, then lower the batch size or --device-num"),
    "SIGSEGV": "a crash in native code: a driver, CANN/CUDA or an extension; the Python stack at the crash is below",
    "SIGBUS": "a bad memory access in native code, often a full /dev/shm (DataLoader workers): check `df -h /dev/shm`",
    "SIGABRT": ("native code aborted (a failed C++ check, an uncaught C++ exception, or the NCCL/HCCL watchdog "
                "ending the process after a collective timed out)"),
    "SIGILL": "an instruction this CPU does not have: a binary built for another CPU",
    "SIGFPE": "an arithmetic fault in native code (an integer division by zero)",
    "SIGTERM": "asked to stop by something other than this launcher (a scheduler's time limit or preemption)",
    "SIGINT": "interrupted (Ctrl-C) outside this launcher",
}
"""Why a rank may have died of each signal, and what to check."""


@dataclass(frozen=True)
class Signature:
    """A known backend error: a pattern in its message or traceback, and what to set or check."""

    pattern: str
    hint: str


ERROR_SIGNATURES: tuple[Signature, ...] = (
    # Interfaces: the backend picked (or was told) an interface that does not exist or cannot reach the peers.
    Signature(r"Unable to find address for|No such device.*ifname|GLOO_SOCKET_IFNAME",
              "gloo could not use the network interface: set GLOO_SOCKET_IFNAME to an interface that exists "
              "on every node and reaches node 0 (`ip -br addr`)"),
    Signature(r"NCCL WARN Net : No interface found|Bootstrap : no socket interface found|NCCL_SOCKET_IFNAME",
              "NCCL found no usable interface: set NCCL_SOCKET_IFNAME to one that exists on every node "
              "(e.g. NCCL_SOCKET_IFNAME=eth0; `ip -br addr` lists them)"),
    Signature(r"HCCL_SOCKET_IFNAME|HCCL_IF_IP",
              "HCCL could not use the host interface: set HCCL_SOCKET_IFNAME (or HCCL_IF_IP) to one that "
              "exists on every node and reaches node 0"),
    # HCCL error codes (Huawei's CANN documentation: "HCCL 建链超时 (EI0006)", EI0002 notify wait timeout).
    Signature(r"EI0006|wait socket establish timeout",
              "HCCL EI0006: building the links between ranks timed out (HCCL_CONNECT_TIMEOUT, default "
              "120 s): a rank started late or cannot reach the others; raise HCCL_CONNECT_TIMEOUT to the "
              "same value on every rank and check the other ranks' first error"),
    Signature(r"EI0002|Notify register times out|notify wait",
              "HCCL EI0002: a collective waited for a remote rank that never joined it (HCCL_EXEC_TIMEOUT): "
              "a rank is behind or failed earlier; look for the first failure above, or use --hang-timeout "
              "to see every rank's stack"),
    Signature(r"\b507046\b|stream sync(hronize)? timeout",
              "Ascend runtime 507046: waiting for the device's stream timed out, usually a collective that "
              "another rank never entered; check the other ranks' first error, or use --hang-timeout"),
    Signature(r"HCCL_CONNECT_TIMEOUT",
              "HCCL_CONNECT_TIMEOUT must be the same on every rank: set it in the launcher's environment, "
              "not per rank"),
    # NCCL.
    Signature(r"unhandled system error",
              "NCCL 'unhandled system error': usually the network or shared memory; rerun with NCCL_DEBUG=INFO "
              "and check NCCL_SOCKET_IFNAME, and /dev/shm size in containers (--shm-size)"),
    Signature(r"Watchdog caught collective operation timeout",
              "torch's collective watchdog timed out: a rank is behind or stuck; use --hang-timeout (below "
              "the process group's timeout) to see every rank's stack and who is behind"),
    Signature(PEER_DIED,
              "a peer rank died first: look for the first failure in this report"),
    # Connections (gloo, TCPStore, NCCL bootstrap).
    Signature(r"Connection refused|ECONNREFUSED",
              "connection refused: the peer (or the store on MASTER_ADDR:MASTER_PORT) is not listening; check "
              "that node 0 is up, the port is open in the firewall, and every node uses the same --port"),
    Signature(PEER_CLOSED,
              "a peer closed its connection: it probably failed first; look for the first failure in this report"),
    Signature(r"[Tt]imed? ?out|Socket Timeout|DistStoreError",
              "a network operation timed out: check that every node can reach MASTER_ADDR and the others (a "
              "firewall, the wrong interface: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME/HCCL_SOCKET_IFNAME)"),
)
"""Known backend errors, most specific first."""

_COMPILED = tuple((re.compile(s.pattern), s.hint) for s in ERROR_SIGNATURES)


def signal_hint(name: str | None) -> str | None:
    """What a death by signal ``name`` (``"SIGKILL"``) usually means, or None."""
    return SIGNAL_HINTS.get(name or "")


def after_a_peer(text: str | None) -> bool:
    """Whether an error (message and traceback) is the consequence of a peer's end, not a cause."""
    return bool(text) and _AFTER_A_PEER.search(text) is not None


def error_hint(text: str | None) -> str | None:
    """The hint of the first known backend error found in ``text`` (message and traceback), or None."""
    if not text:
        return None
    for pattern, hint in _COMPILED:
        if pattern.search(text):
            return hint
    return None
