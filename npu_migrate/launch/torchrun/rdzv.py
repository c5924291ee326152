"""torchrun's rendezvous flags as the launcher reads them: ``--rdzv-backend``, ``--rdzv-endpoint``,
``--rdzv-conf`` and ``--nnodes MIN:MAX``, mapped onto its own ``--addr``, ``--port``, ``--nnodes``
and timing windows.

Usage::

    low, high = node_range("1:4")                          # (1, 4); node_range("2") -> (2, 2)
    host, port = parse_endpoint("node1:29400", 29400)      # torch's endpoint format, without torch
    conf = parse_conf("join_timeout=900,is_host=1")        # {"join_timeout": "900", "is_host": "1"}, checked
    settled = settle(opts)                                 # RdzvSettings, and the --addr/--port/... they give

Everything here is parsed without importing torch, so bad input is refused in one line before
anything heavy starts, in the formats torch's own parsers accept
(``torch.distributed.elastic.rendezvous.utils.parse_rendezvous_endpoint`` and
``_parse_rendezvous_config``, ``torch.distributed.run.parse_min_max_nnodes``; a test compares
them). What each flag means here:

* ``--rdzv-backend static`` (torchrun's default, and the launcher's when the flag is left out):
  every node gives ``--node-rank``; ``--rdzv-endpoint`` is ``MASTER_ADDR:MASTER_PORT``.
* ``--rdzv-backend c10d``: ``--rdzv-endpoint HOST[:PORT]`` (port 29400 when none, as torchrun) is
  node 0's address and port, where its launcher serves the job's stores (``PORT`` for the ranks,
  ``PORT + 1`` for the launchers). Without ``--node-rank`` the rendezvous assigns the node ranks
  (:mod:`..nodes.assignment`); with ``--nnodes MIN:MAX`` it waits for MIN nodes, then up to
  ``last_call_timeout`` for more, up to MAX, and fixes the world there.
* Other backends (``etcd``, ``etcd-v2``, plug-ins) are refused: the launcher's nodes meet in node
  0's store, not in an external service.

``--rdzv-conf`` takes the keys torch's c10d and static rendezvous read (:data:`CONF_KEYS`), each
mapped onto the launcher's own window where one exists; unknown keys are refused (torchrun ignores
them silently, and a misspelt timeout would then do nothing).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from npu_migrate.launch.errors import LaunchUsageError

BACKENDS = ("c10d", "static")
"""The rendezvous backends the launcher accepts; torchrun's default is ``static``."""

C10D_DEFAULT_PORT = 29400
"""torchrun's port for a c10d ``--rdzv-endpoint`` that names none."""

DEFAULT_LAST_CALL_TIMEOUT = 30.0
"""torch's ``last_call_timeout`` default: with ``--nnodes MIN:MAX``, how long the rendezvous waits
for more nodes once MIN are in."""

SECONDS = "seconds"
BOOL = "bool"
TEXT = "text"

CONF_KEYS: dict[str, tuple[str, str]] = {
    "join_timeout": (SECONDS, "--join-timeout: how long to wait for the nodes"),
    "last_call_timeout": (SECONDS, "with --nnodes MIN:MAX, how long to wait for more nodes once MIN are in"),
    "close_timeout": (SECONDS, "how long a rendezvous round may take to close (torch's handler)"),
    "read_timeout": (SECONDS, "the timeout of one call on the launcher store (at least --node-timeout)"),
    "timeout": (SECONDS, "static: --join-timeout (torchrun's static rendezvous timeout); c10d: no effect, as under "
                         "torchrun"),
    "is_host": (BOOL, "c10d: whether this launcher serves the job's stores as node 0 (default: when the endpoint "
                      "is one of this host's addresses, the first launcher there to bind its port)"),
    "heartbeat_timeout": (SECONDS, "no effect: a node counts as lost after --node-timeout"),
    "keep_alive_interval": (SECONDS, "no effect: the launcher's heartbeat follows --node-timeout"),
    "keep_alive_max_attempt": (TEXT, "no effect: a node counts as lost after --node-timeout"),
    "store_type": (TEXT, "tcp only: the launcher serves a TCP store"),
    "use_libuv": (BOOL, "no effect: the launcher picks its store's server backend"),
}
"""The ``--rdzv-conf`` keys torch's c10d and static rendezvous read: kind, and what each does here."""

TRUE = ("1", "true", "t", "yes", "y")
FALSE = ("0", "false", "f", "no", "n")
"""torch's spellings of a boolean rendezvous option (``RendezvousParameters.get_as_bool``)."""


@dataclass(frozen=True)
class RdzvSettings:
    """The rendezvous as the launcher runs it (one node's view; the same on every node).

    Attributes:
        backend: ``static`` or ``c10d``.
        assign: node ranks come from the rendezvous (c10d without ``--node-rank``, several nodes):
            the config's ``node_rank`` is -1 until :mod:`..nodes.assignment` gives one.
        min_nodes: with ``--nnodes MIN:MAX`` (c10d, ranks assigned), MIN; None: ``--nnodes`` is fixed.
        last_call_timeout: seconds to wait for more nodes once ``min_nodes`` are in.
        close_timeout: torch's handler's close timeout (None: :data:`.timing.ROUND_CLOSE_S`).
        read_timeout: the timeout of one store call (None: :func:`.timing.store_call_timeout`'s).
        is_host: whether this launcher serves the stores (None: inferred from the endpoint).
    """

    backend: str = "static"
    assign: bool = False
    min_nodes: int | None = None
    last_call_timeout: float = DEFAULT_LAST_CALL_TIMEOUT
    close_timeout: float | None = None
    read_timeout: float | None = None
    is_host: bool | None = None

    def describe(self, nnodes: int) -> str:
        """For the start-up line: where this node's node rank comes from, of how many nodes."""
        nodes = f"{self.min_nodes} to {nnodes}" if self.min_nodes is not None else f"{nnodes}"
        return f"node rank from the {self.backend} rendezvous, of {nodes} nodes"


@dataclass(frozen=True)
class Settled:
    """What the rendezvous flags give: the settings, and the launcher's own values they set."""

    rdzv: RdzvSettings
    addr: str | None
    port: int | None
    nnodes: int | None
    join_timeout: float


def node_range(text: str) -> tuple[int, int]:
    """``--nnodes N`` or ``MIN:MAX`` as ``(min, max)``.

    Raises:
        ValueError: not one or two whole numbers, below 1, or MIN above MAX (one line).
    """
    parts = str(text).strip().split(":")
    if len(parts) > 2 or not all(re.fullmatch(r"\s*\d+\s*", p) for p in parts):
        raise ValueError(f"{text!r} is not a node count N or a range MIN:MAX of whole numbers, e.g. 2 or 1:4")
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise ValueError(f"{text!r} is not positive: expected the number of nodes, 1 or more")
    if low > high:
        raise ValueError(f"{text!r}: MIN {low} is more than MAX {high}; expected MIN:MAX with MIN <= MAX, e.g. 1:4")
    return low, high


class NodeRange(argparse.Action):
    """``--nnodes N`` or ``--nnodes MIN:MAX``: ``nnodes`` = MAX (or N), ``min_nodes`` = MIN for a range."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            low, high = node_range(values)
        except ValueError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, high)
        namespace.min_nodes = low if low != high else None


def parse_endpoint(endpoint: str, default_port: int | None) -> tuple[str, int | None]:
    """``HOST[:PORT]`` (``[IPv6]:PORT`` too) as ``(host, port)``, as torch's ``parse_rendezvous_endpoint``.

    Raises:
        ValueError: an empty endpoint, a port that is no number below 65536, a host that is no
            name or address.
    """
    text = endpoint.strip()
    if not text:
        raise ValueError("it is empty: expected HOST or HOST:PORT")
    if text[0] == "[" and text[-1] == "]":
        host, rest = text, []
    else:
        host, *rest = text.rsplit(":", 1)
    if len(host) > 1 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    port = default_port
    if rest:
        if not re.fullmatch(r"[0-9]{1,5}", rest[0]) or int(rest[0]) >= 2 ** 16:
            raise ValueError(f"its port {rest[0]!r} is not a number from 0 to 65535")
        port = int(rest[0])
    if not re.fullmatch(r"[\w.:-]+", host):
        raise ValueError(f"its host {host!r} is not a host name, an IPv4 address or an IPv6 address")
    return host, port


def parse_conf(text: str | None) -> dict[str, str]:
    """``--rdzv-conf k=v,...``: the checked keys and values (:data:`CONF_KEYS`).

    Raises:
        LaunchUsageError: a pair without ``=`` or value, an unknown key, a value of the wrong kind.
    """
    conf: dict[str, str] = {}
    for item in (text or "").strip().split(",") if (text or "").strip() else []:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not key or not sep or not value:
            raise LaunchUsageError(f"--rdzv-conf {text!r}: {item.strip()!r} is not KEY=VALUE; expected "
                                   "KEY=VALUE pairs separated by commas, e.g. join_timeout=900,last_call_timeout=30.")
        if key == "rank":
            raise LaunchUsageError(f"--rdzv-conf {key}={value}: give the node rank as --node-rank {value}.")
        if key not in CONF_KEYS:
            raise LaunchUsageError(f"--rdzv-conf has an unknown key {key!r}: expected some of "
                                   f"{', '.join(CONF_KEYS)}.")
        kind = CONF_KEYS[key][0]
        if kind == SECONDS:
            try:
                ok = float(value) > 0
            except ValueError:
                ok = False
            if not ok:
                raise LaunchUsageError(f"--rdzv-conf {key}={value}: expected a positive number of seconds.")
        elif kind == BOOL and value.lower() not in TRUE + FALSE:
            raise LaunchUsageError(f"--rdzv-conf {key}={value}: expected a boolean ({'/'.join(TRUE)} or "
                                   f"{'/'.join(FALSE)}).")
        elif key == "store_type" and value.lower() != "tcp":
            raise LaunchUsageError(f"--rdzv-conf store_type={value}: the launcher serves a TCP store only; "
                                   "leave it out or pass store_type=tcp.")
        elif key == "keep_alive_max_attempt" and not value.isdigit():
            raise LaunchUsageError(f"--rdzv-conf {key}={value}: expected a whole number.")
        conf[key] = value
    return conf


def settle(backend: str | None, endpoint: str | None, conf_text: str | None, nnodes: int | None,
           min_nodes: int | None, node_rank: int | None, addr: str | None, port: int | None,
           join_timeout: float) -> Settled:
    """Check the rendezvous flags and map them onto ``--addr``, ``--port``, ``--nnodes``, ``--join-timeout``.

    ``assign`` in the result is only a wish here (c10d without ``--node-rank``): whether the job
    has several nodes is known once the scheduler's environment was read (:func:`.config.make_config`).

    Raises:
        LaunchUsageError: one line naming the flag, its value and what was expected.
    """
    name = backend or "static"
    if name not in BACKENDS:
        raise LaunchUsageError(
            f"--rdzv-backend {name!r} is not supported: expected c10d (node ranks from the rendezvous, node 0 "
            "at --rdzv-endpoint) or static (--node-rank on every node); the launcher's nodes meet in node 0's "
            "own store, not in an external service such as etcd.")
    conf = parse_conf(conf_text)
    if nnodes is not None and min_nodes is not None:
        try:
            node_range(f"{min_nodes}:{nnodes}")
        except ValueError as exc:
            raise LaunchUsageError(f"--nnodes {exc}.") from exc
    elastic = min_nodes is not None and nnodes is not None and min_nodes != nnodes
    if elastic and name == "c10d" and node_rank is not None:
        raise LaunchUsageError(
            f"--nnodes {min_nodes}:{nnodes} with --node-rank {node_rank}: the rendezvous numbers the nodes of an "
            "elastic job; leave --node-rank out on every node, or give a fixed --nnodes.")
    if endpoint is not None and endpoint.strip():  # torchrun's default is "": none given
        try:
            host, given = parse_endpoint(endpoint, C10D_DEFAULT_PORT if name == "c10d" else None)
        except ValueError as exc:
            raise LaunchUsageError(f"--rdzv-endpoint {endpoint!r} is not HOST[:PORT]: {exc}.") from exc
        if addr is not None and addr != host:
            raise LaunchUsageError(f"--rdzv-endpoint {endpoint} and --addr {addr} name different nodes: give one "
                                   "of them (the endpoint is node 0's address).")
        if port is not None and given is not None and port != given:
            raise LaunchUsageError(f"--rdzv-endpoint {endpoint} and --port {port} name different ports: give one "
                                   "of them.")
        if given == 0:
            if (nnodes or 1) > 1:
                raise LaunchUsageError(f"--rdzv-endpoint {endpoint}: port 0 (a free port) works on one node only; "
                                       "give the port every node uses.")
            given = None  # a free port, picked as for any one-node job
        addr, port = host, port if given is None else given
    if "join_timeout" in conf:
        join_timeout = float(conf["join_timeout"])
    elif name == "static" and "timeout" in conf:
        join_timeout = float(conf["timeout"])
    is_host = conf.get("is_host")
    rdzv = RdzvSettings(
        backend=name,
        assign=name == "c10d" and node_rank is None,
        min_nodes=min_nodes if elastic and name == "c10d" else None,
        last_call_timeout=float(conf.get("last_call_timeout", DEFAULT_LAST_CALL_TIMEOUT)),
        close_timeout=float(conf["close_timeout"]) if "close_timeout" in conf else None,
        read_timeout=float(conf["read_timeout"]) if "read_timeout" in conf else None,
        is_host=None if is_host is None else is_host.lower() in TRUE,
    )
    # A static rendezvous is never elastic: torchrun's waits for MAX nodes (its world size).
    return Settled(rdzv, addr, port, nnodes, join_timeout)
