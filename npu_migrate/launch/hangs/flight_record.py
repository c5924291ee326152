"""The flight record's file: one rank's current collective, progress counter and heartbeat, in shared memory.

Usage::

    record = FlightRecord(record_path(run_dir, rank), rank)   # in the worker (by flight.install)
    recorded = record.enter(b"all_reduce", group); ...; record.leave(recorded)

    state = read(record_path(run_dir, rank))   # in the launcher: FlightState(op="all_reduce", seq=58, ...)
    state.describe()                           # "in all_reduce #58 since 12:00:01"

What is recorded, and when, is :mod:`npu_migrate.launch.hangs.flight`'s (it wraps torch's collectives).

**Where.** A fixed-size file per rank in the launcher's run directory, mapped into the worker
(``mmap``): a call updates it with ``struct.pack_into`` into shared memory, no system call, and the
launcher reads it with ``pread`` twice and keeps it when both reads agree (a record is never
half-written for long: entering is one ``pack_into``, leaving another). Layout, little-endian (``version`` 1):

============ ======= ==================================================================
offset       format  field
============ ======= ==================================================================
0            4s I    magic ``NMFR``, version
8            i I     rank, pid
16           I       update counter (one more per write)
20           I       1 while in a collective, else 0
24           d       ended at (``time.time()``; 0 while in the collective)
32           Q       collectives entered so far (the progress counter)
40           Q       sequence number of the current/last collective in its group
48           d       entered at (``time.time()``)
56           32s     op name (``all_reduce``), NUL-padded
88           64s     group (``world`` or ``ranks 0,2``), NUL-padded
152          d       heartbeat: ``time.time()`` written by a daemon thread every second
============ ======= ==================================================================
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

MAGIC = b"NMFR"
VERSION = 1
_HEAD = struct.Struct("<4sIiI")
_BODY = struct.Struct("<IIdQQd32s64s")
_BODY_AT = _HEAD.size
_LEAVE = struct.Struct("<IId")  # counter, state, ended: the body's first fields
_BEAT = struct.Struct("<d")
_BEAT_AT = _BODY_AT + _BODY.size
SIZE = _BEAT_AT + _BEAT.size
HEARTBEAT_S = 1.0
"""How often a worker's heartbeat thread stamps the record."""
PENDING_WORKS = 1024
"""Works of asynchronous collectives remembered until waited on (FSDP2 keeps a few in flight; a
Work never waited on is forgotten after this many newer ones)."""


def record_path(run_dir: str, rank: int) -> str:
    """Where rank ``rank``'s flight record lives in the launcher's run directory."""
    return os.path.join(run_dir, f"flight-rank{rank}.bin")


@dataclass(frozen=True)
class FlightState:
    """One rank's flight record, as the launcher reads it.

    Attributes:
        rank: global rank.
        pid: the worker's process id.
        in_collective: the rank is inside ``op`` now.
        count: collectives entered so far (any change is progress).
        seq: sequence number of ``op`` in its group.
        op: the current (or last) collective; "" before the first.
        group: ``world`` or ``ranks 0,2``.
        entered: wall time the rank entered ``op``.
        ended: wall time ``op`` returned (0 while in it).
        heartbeat: wall time of the last heartbeat.
    """

    rank: int
    pid: int
    in_collective: bool
    count: int
    seq: int
    op: str
    group: str
    entered: float
    ended: float
    heartbeat: float

    @property
    def progress(self) -> tuple[int, bool]:
        """What changes whenever the rank enters or leaves a collective."""
        return self.count, self.in_collective

    def describe(self) -> str:
        """``in all_reduce #58 since 12:00:01`` or ``not in a collective (last: ...)``."""
        if self.in_collective:
            return f"in {self.label()} since {clock(self.entered)}"
        if not self.op:
            return "not in a collective (none entered yet)"
        return f"not in a collective (last: {self.label()} ended {clock(self.ended)})"

    def label(self) -> str:
        where = "" if self.group == "world" else f" ({self.group})"
        return f"{self.op} #{self.seq}{where}"

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "state": self.describe()}


def clock(t: float) -> str:
    """Wall time as the console shows it: ``12:00:01``."""
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "?"


def read(path: str) -> FlightState | None:
    """A rank's record, or None if it is missing or not (yet) whole."""
    try:
        with open(path, "rb") as fh:
            for _ in range(20):
                first = os.pread(fh.fileno(), SIZE, 0)
                second = os.pread(fh.fileno(), SIZE, 0)
                if len(first) == SIZE and first == second:
                    return _parse(first)
    except OSError:
        return None
    return None


def _parse(data: bytes) -> FlightState | None:
    magic, version, rank, pid = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        return None
    _, state, ended, count, seq, entered, op, group = _BODY.unpack_from(data, _BODY_AT)
    (beat,) = _BEAT.unpack_from(data, _BEAT_AT)
    return FlightState(rank, pid, bool(state), count, seq, op.rstrip(b"\0").decode(errors="replace"),
                       group.rstrip(b"\0").decode(errors="replace"), entered, ended, beat)


class FlightRecord:
    """The writing side, in the worker: a shared mapping updated on every collective."""

    def __init__(self, path: str, rank: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._map[:_HEAD.size] = _HEAD.pack(MAGIC, VERSION, rank, os.getpid())
        self._updates = 0
        self._count = 0
        self._depth = 0
        self._seqs: dict[Any, int] = {}
        self._groups: dict[int, tuple[Any, Any, bytes]] = {}  # id -> (group, key, label)
        self._pending: dict[int, tuple[Any, bytes, int, bytes]] = {}  # id(work) -> (work, op, seq, label)
        self._last: tuple[bytes, int, bytes] = (b"", 0, b"")  # op, seq, label of the last entered
        _BODY.pack_into(self._map, _BODY_AT, 0, 0, 0.0, 0, 0, 0.0, b"", b"")
        self.beat()

    def beat(self) -> None:
        _BEAT.pack_into(self._map, _BEAT_AT, time.time())

    def enter(self, op: bytes, group: Any) -> bool:
        """Record entering ``op`` on ``group``; False (nothing recorded) when nested in another."""
        self._depth += 1
        if self._depth > 1:
            return False
        key, label = ("world", b"world") if group is None else self._group(group)
        seq = self._seqs.get(key, 0) + 1
        self._seqs[key] = seq
        self._enter(op, seq, label)
        return True

    def _enter(self, op: bytes, seq: int, label: bytes) -> None:
        self._count += 1
        self._updates += 1
        self._last = (op, seq, label)
        _BODY.pack_into(self._map, _BODY_AT, self._updates, 1, 0.0, self._count, seq, time.time(), op, label)

    def pending(self, work: Any) -> None:
        """Remember ``work``, returned by the collective just recorded, for :meth:`wait_started`."""
        self._pending[id(work)] = (work, *self._last)
        if len(self._pending) > PENDING_WORKS:
            del self._pending[next(iter(self._pending))]

    def wait_started(self, work: Any) -> bool:
        """Record waiting on an asynchronous collective's ``work`` as being in it; False: not one of ours."""
        known = self._pending.pop(id(work), None)
        if known is None or known[0] is not work or self._depth > 0:  # not ours, or inside a recorded call
            return False
        self._depth += 1
        self._enter(*known[1:])
        return True

    def leave(self, recorded: bool) -> None:
        self._depth -= 1
        if recorded:
            self._updates += 1
            _LEAVE.pack_into(self._map, _BODY_AT, self._updates, 0, time.time())

    def _group(self, group: Any) -> tuple[Any, bytes]:
        if group is None:
            return "world", b"world"
        known = self._groups.get(id(group))
        if known is not None and known[0] is group:
            return known[1], known[2]
        label = _group_label(group)
        key: Any = "world" if label == b"world" else id(group)  # one numbering for the world group
        self._groups[id(group)] = (group, key, label)
        return key, label


def _group_label(group: Any) -> bytes:
    """``world`` for the default group, else its global ranks, compact: ``ranks 0-3,6``."""
    import torch.distributed as dist

    try:
        if group is dist.group.WORLD:
            return b"world"
        ranks = sorted(dist.get_process_group_ranks(group))
        if ranks == list(range(dist.get_world_size())):
            return b"world"
    except Exception:  # noqa: BLE001 - a group torch does not know (destroyed): label it plainly
        return b"group ?"
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return f"ranks {','.join(parts)}".encode()[:64]
