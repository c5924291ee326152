"""The flight record of one rank (written in it, read by the launcher): its collective, progress and heartbeat.

Usage (in a worker, by :mod:`..procs.worker`; the user's script is not changed)::

    record = install(run_dir, rank)          # flight-rank{N}.bin in the launcher's run directory
    ...                                      # dist.all_reduce(...) etc. now keep the record current

    # in the launcher, at any time, without a syscall in the worker
    state = read(path)                       # FlightState(op="all_reduce", seq=58, in_collective=True...)
    state.describe()                         # "in all_reduce #58 since 12:00:01"

**What is recorded.** :func:`install` wraps the collectives of ``torch.distributed`` (the package
attributes that scripts, FSDP and DTensor call through ``dist.*``) at the worker's start-up. Which
functions are collectives is read from torch itself (:func:`collective_names`): the public
functions of ``distributed_c10d`` that take a ``group`` and work on tensors or objects (or are a
barrier), on every torch from 2.1 on, with no list of names kept here. Each call records, on
entry, the op name, its sequence number in its group (1, 2, ... per group, as the NCCL flight
recorder numbers them), the group (``world`` or its ranks) and the wall time, and on return the
time it ended. Calls nested inside a recorded one are not recorded again. ``async_op=True`` calls
count as ended when they return (the record does not follow the returned Work).

**DDP's gradient all-reduce** runs inside ``backward()``, from C++, never through
``torch.distributed.*``. It is recorded as ``ddp_backward`` on the DDP module's group: a gradient
hook on the first output of each ``DistributedDataParallel.forward`` that requires grad marks the
start of its backward, and a final callback of the autograd engine, queued behind DDP's own (which
waits for the all-reduces), marks its end. A rank that waits there for the gradients of a rank that
never reached its backward shows as ``in ddp_backward #N``, and that rank as behind. Outputs that
need no grad (evaluation) record nothing.

**Collectives torch issues below ``torch.distributed.*``.** DDP's buffer broadcast (in
``forward``) and its parameter broadcast at construction go through ``dist._broadcast_coalesced``,
its construction check through ``dist._verify_params_across_processes``: C++ functions, wrapped
like the collectives and recorded as ``broadcast_coalesced`` and ``verify_params``.

**Waits on asynchronous collectives.** FSDP2 issues its all-gathers and reduce-scatters with
``async_op=True`` (``all_gather_single`` from torch 2.14, ``all_gather_into_tensor`` before it;
``reduce_scatter_single`` or ``reduce_scatter_tensor``) and waits on the returned
``Work`` later, from another place: a rank blocked there is in the collective although the call
returned long before. The call is recorded (entered and ended, as any), the Work it returned is
remembered (the last :data:`PENDING_WORKS`), and ``Work.wait()`` on it records the same
collective again, with the same op and sequence number, for as long as the wait lasts. A stuck
FSDP2 job therefore shows the ranks waiting in ``all_gather_single #N`` (or
``all_gather_into_tensor #N``) and names the rank that
never issued it.

**The record's file.** A fixed-size file per rank in the launcher's run directory, mapped into the
worker (``mmap``): a call updates it with ``struct.pack_into`` into shared memory, no system call, and the
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

import functools
import inspect
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["BELOW_DIST", "HEARTBEAT_S", "MAGIC", "PENDING_WORKS", "SIZE", "VERSION", "FlightRecord", "FlightState",
           "clock", "collective_names", "install", "read", "record_path"]

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


# -- in the worker: what keeps the record current

BELOW_DIST = {"_broadcast_coalesced": b"broadcast_coalesced", "_verify_params_across_processes": b"verify_params"}
"""C++ functions of ``torch.distributed`` that DDP calls for its collectives, with the op name recorded;
the process group is their first argument."""


def collective_names() -> list[str]:
    """The collectives of ``torch.distributed``, read from this torch's ``distributed_c10d``.

    A public function there is a collective when it takes a ``group`` and either works on tensors
    or objects (a parameter named ``*tensor*``/``*obj*``), takes ``async_op``, or is a barrier;
    queries (``get_rank(group)``) and settings (``set_timeout``) take a group but none of these.
    """
    import torch.distributed.distributed_c10d as c10d

    names = []
    for name in getattr(c10d, "__all__", ()):
        fn = getattr(c10d, name, None)
        if not callable(fn) or inspect.isclass(fn) or name.startswith(("get_", "destroy_", "is_", "new_", "init_")):
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if "group" not in params:
            continue
        if "async_op" in params or "barrier" in name or any("tensor" in p or "obj" in p for p in params):
            names.append(name)
    return sorted(names)


def _wrap(name: str, fn: Callable[..., Any], record: FlightRecord, op: bytes | None = None,
          position: int | None = None) -> Callable[..., Any]:
    op = op or name.encode()[:32]
    if position is None:
        try:
            position = list(inspect.signature(fn).parameters).index("group")
        except (TypeError, ValueError):
            position = -1
    work_type = _work_type()

    @functools.wraps(fn)
    def collective(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        if group is None and 0 <= position < len(args):
            group = args[position]
        recorded = record.enter(op, group)
        try:
            result = fn(*args, **kwargs)
            if recorded and work_type is not None and isinstance(result, work_type):
                record.pending(result)  # async_op=True: the wait is where a rank blocks
            return result
        finally:
            record.leave(recorded)

    collective.__npu_migrate_flight__ = fn  # type: ignore[attr-defined]
    return collective


_DDP_BACKWARD = b"ddp_backward"


def _watch_ddp(record: FlightRecord) -> None:
    """Record DDP's backward (its gradient all-reduce) as ``ddp_backward`` on the module's group."""
    from torch.autograd import Variable
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils._pytree import tree_flatten

    forward = DistributedDataParallel.forward
    if hasattr(forward, "__npu_migrate_flight__"):
        return
    queue = Variable._execution_engine.queue_callback

    def backward_started(group: Any) -> Callable[[Any], None]:
        def hook(grad: Any) -> None:
            recorded = record.enter(_DDP_BACKWARD, group)
            # Queued now, DDP's final callback (it waits for the all-reduces) is queued after this
            # one; this one queues the end behind it.
            queue(lambda: queue(lambda: record.leave(recorded)))

        return hook

    @functools.wraps(forward)
    def ddp_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = forward(self, *args, **kwargs)
        import torch

        if torch.is_grad_enabled():
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    value.register_hook(backward_started(getattr(self, "process_group", None)))
                    break
        return out

    ddp_forward.__npu_migrate_flight__ = forward  # type: ignore[attr-defined]
    DistributedDataParallel.forward = ddp_forward  # type: ignore[method-assign]


def _work_type() -> type | None:
    try:
        from torch.distributed.distributed_c10d import Work
    except ImportError:
        return None
    return Work


def _watch_waits(record: FlightRecord) -> None:
    """``Work.wait()`` on an asynchronous collective's Work records the collective while it waits."""
    work_type = _work_type()
    if work_type is None or hasattr(work_type.wait, "__npu_migrate_flight__"):
        return
    wait = work_type.wait

    def waiting(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorded = record.wait_started(self)
        try:
            return wait(self, *args, **kwargs)
        finally:
            if recorded:
                record.leave(True)

    waiting.__npu_migrate_flight__ = wait  # type: ignore[attr-defined]
    waiting.__doc__ = getattr(wait, "__doc__", None)
    work_type.wait = waiting  # type: ignore[method-assign]


def _heartbeat(record: FlightRecord) -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        record.beat()


def install(run_dir: str, rank: int) -> FlightRecord:
    """Start this worker's flight record: wrap ``torch.distributed``'s collectives, start the heartbeat.

    Args:
        run_dir: the launcher's run directory (the record is ``flight-rank{rank}.bin`` there).
        rank: this worker's global rank.

    Returns:
        The record (kept alive by the wrappers and the heartbeat thread).
    """
    import torch.distributed as dist

    record = FlightRecord(record_path(run_dir, rank), rank)
    for name in collective_names():
        fn = getattr(dist, name, None)
        if fn is not None and not hasattr(fn, "__npu_migrate_flight__"):
            setattr(dist, name, _wrap(name, fn, record))
    for name, op in BELOW_DIST.items():
        fn = getattr(dist, name, None)
        if fn is not None and not hasattr(fn, "__npu_migrate_flight__"):
            setattr(dist, name, _wrap(name, fn, record, op=op, position=0))
    _watch_waits(record)
    _watch_ddp(record)
    threading.Thread(target=_heartbeat, args=(record,), name="npu_migrate-flight-heartbeat", daemon=True).start()
    return record
