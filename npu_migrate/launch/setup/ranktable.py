"""HCCL rank tables (``RANK_TABLE_FILE``): read one, wait until it is complete, find this server in it.

Usage::

    table = wait_for_table("/user/serverid/devindex/config/hccl.json", timeout=300.0)
    table, server = settle(detected, values, flags, timeout, os.environ)   # what the launcher calls
    me = table.this_server(node_rank=None)         # by this host's addresses or pod name
    me.ranks                                       # (8, 9, 10, 11): global rank of local rank 0, 1, ...
    table.world_size, len(table.servers)

**Layouts** (CANN's "ranktable file" reference and MindCluster's ``hccl.json`` description;
writers: ``Ascend/mind-cluster`` ``component/ascend-operator/pkg/ranktable`` and
``Ascend/ascend-hccl-controller`` ``pkg/ring-controller/ranktable/v1``):

- servers (``version`` 1.0, and 1.2 for super-pod clusters)::

    {"status": "completed", "version": "1.2", "server_count": "2",
     "server_list": [{"server_id": "10.0.0.1", "host_ip": "10.0.0.1", "container_ip": "172.16.0.5",
                      "device": [{"device_id": "0", "device_ip": "...", "super_device_id": "0",
                                  "rank_id": "0"}, ...]}, ...],
     "super_pod_list": [{"super_pod_id": "0", "server_list": [{"server_id": "10.0.0.1"}]}]}

  Every device has its global ``rank_id``; ``super_pod_list`` groups servers and changes no rank.
- groups (``version`` 1.0 from hccl-controller, CANN's "template 2")::

    {"status": "completed", "group_count": "1",
     "group_list": [{"group_name": "job", "device_count": "8", "instance_count": "1",
                     "instance_list": [{"pod_name": "job-0", "server_id": "10.0.0.1",
                                        "devices": [{"device_id": "0", "device_ip": "..."}, ...]}]}]}

  No ``rank_id``: ranks are numbered in file order, instance by instance (the order the
  controller added the pods), unless a device carries one.

**Waiting.** The operator writes the file asynchronously, after every pod of the job has its NPUs;
until then ``status`` is ``initializing`` (or the file is missing or half written). The launcher
reads it, then looks at the file every :data:`POLL_S` seconds and re-reads it when it changed
(``os.stat``: another inode, size or modification time; a ConfigMap mount replaces a symlink, a
shared volume rewrites the file), until ``status`` is ``completed`` or the wait
(``--rank-table-timeout``, ``NPU_MIGRATE_RANK_TABLE_TIMEOUT``) runs out. The file is written once,
when every pod of the job has its NPUs (seconds to minutes after the launcher starts): the poll adds
at most :data:`POLL_S` to that wait, and a ``stat`` per interval. Measured against the inotify watch
of the directory (through ``ctypes``) that it replaced, 14 writes each, on 2 shared cores, Python 3.11:
a write is seen after 0.10 s (median; 0.19 s at most) instead of 0.02 s, and 10 s of waiting cost
4 ms of CPU instead of 1 ms; not worth 61 lines of ``ctypes``.

**This server** is the one whose ``container_ip``, ``host_ip`` or ``server_id`` is an address of
this host, or whose ``pod_name`` is this host's name; where several match (one host running several
"pods", as the tests do) or none does, the node rank from the flags or the scheduler picks it
(servers ordered by their first rank). Local rank ``i`` drives the ``i``-th of the server's
devices in ``device_id`` order (a container numbers its NPUs that way), and gets that device's rank.

Nothing here imports torch.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from npu_migrate.launch.setup import cluster, schedulers
from npu_migrate.launch.errors import LaunchError, LaunchUsageError, say
from npu_migrate.textsafe import printable

DEFAULT_TIMEOUT = 600.0
"""Seconds to wait for ``completed``: the operator writes the table only after every pod of the job
is scheduled and has its NPUs, which on a busy cluster takes minutes (pods pulling a large image);
the same as ``--join-timeout``'s default, the wait for the other nodes' launchers."""

TIMEOUT_ENV = "NPU_MIGRATE_RANK_TABLE_TIMEOUT"
"""Variable that sets the wait when ``--rank-table-timeout`` is not given."""

POLL_S = 0.2
"""How often :func:`wait_for_table` looks at the file (a ``stat``) while it waits for ``completed``."""

_MAX_BYTES = 64 * 1024 * 1024
"""Larger files are refused: hccl-controller caps its own at 50 MiB."""


class TableStatus(Enum):
    """The ``status`` field the writer sets."""

    COMPLETED = "completed"
    INITIALIZING = "initializing"


class RankTableError(ValueError):
    """A rank table that cannot be used; the message is one line naming the file."""


class WaitInterrupted(LaunchError):
    """Ctrl-C while waiting for the rank table (exit code 130, as for SIGINT)."""

    exit_code = 130


@dataclass(frozen=True)
class Server:
    """One server (pod) of the table.

    Attributes:
        index: its place when servers are ordered by their first rank.
        names: ``server_id``, ``host_ip``, ``container_ip`` and ``pod_name`` as given.
        devices: ``(device_id, rank_id)`` pairs in ``device_id`` order.
    """

    index: int
    names: tuple[tuple[str, str], ...]
    devices: tuple[tuple[int, int], ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(rank for _, rank in self.devices)

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(device for device, _ in self.devices)

    def name(self) -> str:
        """How messages name it (file text, made printable)."""
        values = dict(self.names)
        return printable(values.get("server_id") or values.get("pod_name") or f"server {self.index}", 100)

    def address(self) -> str | None:
        """An IP address other servers can reach it at (container, host, then server id)."""
        values = dict(self.names)
        for key in ("container_ip", "host_ip", "server_id"):
            if _is_ip(values.get(key, "")):
                return values[key]
        return None


@dataclass(frozen=True)
class RankTable:
    """A complete rank table."""

    path: str
    version: str
    servers: tuple[Server, ...]

    @property
    def world_size(self) -> int:
        return sum(len(s.devices) for s in self.servers)

    def this_server(self, node_rank: int | None) -> Server:
        """The server of this host (see the module docstring).

        Raises:
            RankTableError: none can be told apart, or the node rank contradicts the table.
        """
        host = socket.gethostname()
        mine = [s for s in self.servers if _is_mine(s, host)]
        if node_rank is not None and not 0 <= node_rank < len(self.servers):
            raise RankTableError(f"node rank {node_rank} is outside the {len(self.servers)} servers of the rank "
                                 f"table {self.path}: the job and the table disagree on its size.")
        if len(mine) == 1:  # an address is surer than a node rank (an AscendJob numbers servers its own way)
            return mine[0]
        if node_rank is not None:
            return self.servers[node_rank]
        raise RankTableError(
            f"cannot tell which server of the rank table {self.path} is this host ({host}): "
            f"{'several' if mine else 'none'} of its server_id/host_ip/container_ip/pod_name match; "
            "pass --node-rank with this server's place in the table.")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_mine(server: Server, host: str) -> bool:
    for key, value in server.names:
        if key == "pod_name" and value == host:
            return True
        if key != "pod_name" and _is_ip(value) and cluster.is_local_address(value):
            return True
    return False


def _number(path: str, where: str, value: Any) -> int:
    text = str(value).strip()
    if not text.isdigit():
        raise RankTableError(f"rank table {path}: {where} is {printable(repr(value), 60)}, not a non-negative integer.")
    return int(text)


def _names(entry: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((k, str(entry[k])) for k in ("server_id", "host_ip", "container_ip", "pod_name") if entry.get(k))


def parse(text: str, path: str) -> RankTable | None:
    """A rank table from its text; None while it is not ``completed`` (or not yet whole JSON).

    Raises:
        RankTableError: a complete table that cannot be used.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None  # half written: the next change completes it
    if not isinstance(data, dict):
        raise RankTableError(f"rank table {path}: expected a JSON object, found {type(data).__name__}.")
    if data.get("status") != TableStatus.COMPLETED.value:
        return None
    raw: list[tuple[tuple[tuple[str, str], ...], list[tuple[int, int | None]]]] = []
    if isinstance(data.get("server_list"), list):
        for i, server in enumerate(data["server_list"]):
            devices = [(_number(path, f"server_list[{i}] device_id", d.get("device_id")),
                        _number(path, f"server_list[{i}] rank_id", d.get("rank_id")))
                       for d in server.get("device") or []]
            raw.append((_names(server), devices))
        if "server_count" in data and _number(path, "server_count", data["server_count"]) != len(raw):
            raise RankTableError(f"rank table {path}: server_count is {data['server_count']} but server_list "
                                 f"has {len(raw)} servers.")
    elif isinstance(data.get("group_list"), list):
        for g, group in enumerate(data["group_list"]):
            for i, inst in enumerate(group.get("instance_list") or []):
                devices = [(_number(path, f"group_list[{g}] instance {i} device_id", d.get("device_id")),
                            _number(path, f"group_list[{g}] instance {i} rank_id", d["rank_id"])
                            if "rank_id" in d else None)
                           for d in inst.get("devices") or []]
                raw.append((_names(inst), devices))
    else:
        raise RankTableError(f"rank table {path}: neither server_list (version 1.0/1.2) nor group_list "
                             "(version 1.0 groups) is there.")
    servers = _numbered(path, raw)
    return RankTable(path, str(data.get("version", "1.0")), servers)


def _numbered(path: str, raw: list[Any]) -> tuple[Server, ...]:
    """Fill in file-order ranks where none are given, check them, order servers by first rank."""
    next_rank = 0
    filled = []
    for names, devices in raw:
        if not devices:
            raise RankTableError(f"rank table {path}: server {printable(dict(names).get('server_id', '?'), 100)} "
                                 "lists no devices.")
        pairs = []
        for device, rank in devices:
            pairs.append((device, next_rank if rank is None else rank))
            next_rank += 1
        filled.append((names, sorted(pairs)))
    ranks = sorted(r for _, pairs in filled for _, r in pairs)
    if ranks != list(range(len(ranks))):
        extra = sorted({r for r in ranks if ranks.count(r) > 1} | {r for r in ranks if r >= len(ranks)})
        raise RankTableError(f"rank table {path}: rank_id values are not 0-{len(ranks) - 1} once each "
                             f"(duplicated or out of range: {extra[:5]}).")
    filled.sort(key=lambda item: min(r for _, r in item[1]))
    return tuple(Server(i, names, tuple(pairs)) for i, (names, pairs) in enumerate(filled))


def read_once(path: str) -> tuple[RankTable | None, str]:
    """The table if complete, and its status in words (``--print-env``)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None, "not written yet"
    except OSError as exc:
        raise RankTableError(f"rank table {path} cannot be read ({exc.strerror}): check RANK_TABLE_FILE and "
                             "the volume it is on.") from exc
    if len(text) > _MAX_BYTES:
        raise RankTableError(f"rank table {path} is larger than {_MAX_BYTES >> 20} MiB: not a rank table.")
    table = parse(text, path)
    if table is not None:
        return table, "completed"
    try:
        status = json.loads(text).get("status", "no status")
    except (ValueError, AttributeError):
        status = "being written"
    return None, printable(status, 60)


def wait_for_table(path: str, timeout: float, on_wait: Callable[[str], None] | None = None) -> RankTable:
    """Read ``path`` until its status is ``completed``; re-read it whenever it changed (every :data:`POLL_S`).

    Args:
        on_wait: called once with the status when the first read finds the table not ready.

    Raises:
        RankTableError: a complete table that cannot be used, or ``timeout`` seconds without one.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise RankTableError(f"RANK_TABLE_FILE {path}: its directory {directory} does not exist; mount the "
                             "rank table's volume (or ConfigMap) there, or fix the path.")
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            seen = _signature(path)  # before the read, so a write right after it is not missed
            table, status = read_once(path)
            if table is not None:
                return table
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankTableError(
                    f"rank table {path} is still {status!r} after {timeout:g} s (--rank-table-timeout): the "
                    "operator writes it once every pod of the job has its NPUs; check the other pods, or "
                    f"wait longer with --rank-table-timeout or {TIMEOUT_ENV}.")
            if not told and on_wait is not None:
                on_wait(status)
                told = True
            while _signature(path) == seen and time.monotonic() < deadline:
                time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    except KeyboardInterrupt:
        raise WaitInterrupted(f"interrupted while waiting for the rank table {path}.") from None


def _signature(path: str) -> tuple[int, ...] | None:
    """What changes when the file is written or replaced (None: missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def settle(found: schedulers.Detected, values: dict[str, Any], given: dict[str, Any],
           timeout: float | None, environ: dict[str, str]) -> tuple[RankTable, Server]:
    """Wait for the rank table, find this server, and check it against what the job says.

    Args:
        found: what the scheduler's environment says (``found.rank_table`` is the path).
        values: the settings so far (flags over the scheduler's), read for the cross-checks.
        given: the flags alone, to name them in messages.
        timeout: seconds to wait (None: :data:`TIMEOUT_ENV`, else :data:`DEFAULT_TIMEOUT`).

    Returns:
        The table and this host's server in it.

    Raises:
        LaunchUsageError: a table that disagrees with the flags, the scheduler or the visible NPUs.
        LaunchError: no complete table in time, or one that cannot be used.
    """
    path = str(found.rank_table)
    if timeout is None:
        text = environ.get(TIMEOUT_ENV, "").strip()
        try:
            timeout = float(text) if text else DEFAULT_TIMEOUT
        except ValueError:
            raise LaunchUsageError(f"{TIMEOUT_ENV}={text!r} is not a number: expected seconds.") from None
    if timeout <= 0:
        raise LaunchUsageError(f"--rank-table-timeout {timeout:g} is not positive: expected seconds to wait.")
    try:
        table = wait_for_table(path, timeout, lambda status: say(
            f"waiting up to {timeout:g} s for the rank table {path} (now {status!r}) to be completed"))
        server = table.this_server(values["node_rank"])
    except RankTableError as exc:
        raise LaunchError(str(exc)) from exc
    counts = sorted({len(s.devices) for s in table.servers})
    if len(counts) > 1:
        raise LaunchUsageError(f"the rank table {path} gives servers {counts[0]} to {counts[-1]} devices: the "
                               "launcher runs the same number of processes on every node.")
    where = f"the rank table {path}"
    if values["nnodes"] is not None and int(values["nnodes"]) != len(table.servers):
        raise LaunchUsageError(f"{schedulers.given_as('nnodes', given['nnodes'], found)} node(s), but {where} lists "
                               f"{len(table.servers)} server(s): use the same job on both sides.")
    if values["nproc"] is not None and int(values["nproc"]) != len(server.devices):
        raise LaunchUsageError(f"{schedulers.given_as('nproc', given['nproc'], found)} process(es) on this node, "
                               f"but {where} lists {len(server.devices)} device(s) for this server "
                               f"({server.name()}): drop --device-num or make it match.")
    visible = environ.get("ASCEND_VISIBLE_DEVICES", "")
    ids = schedulers.visible_ids(visible)
    if ids and all(i.isdigit() for i in ids) and sorted(int(i) for i in ids) != sorted(server.device_ids):
        raise LaunchUsageError(f"ASCEND_VISIBLE_DEVICES={visible} but {where} gives this server "
                               f"({server.name()}) devices {','.join(map(str, server.device_ids))}: the pod "
                               "holds other NPUs than the table says; check the job's device plugin.")
    return table, server
