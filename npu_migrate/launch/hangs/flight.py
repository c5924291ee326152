"""The flight record of one rank: the collective it is in, the last one it finished, and a heartbeat.

Usage (in a worker, by :mod:`.worker`; the user's script is not changed)::

    record = install(run_dir, rank)          # flight-rank{N}.bin in the launcher's run directory
    ...                                      # dist.all_reduce(...) etc. now keep the record current

    # in the launcher, at any time, without a syscall in the worker
    state = read(path)                       # FlightState(op="all_reduce", seq=58, in_collective=True...)

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

The record itself (its file, layout and reader) is :mod:`npu_migrate.launch.hangs.flight_record`'s,
re-exported here.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from typing import Any, Callable

from npu_migrate.launch.hangs.flight_record import (  # re-exported: their home before the split
    HEARTBEAT_S, MAGIC, PENDING_WORKS, SIZE, VERSION, FlightRecord, FlightState, clock, read, record_path,
)

__all__ = ["BELOW_DIST", "HEARTBEAT_S", "MAGIC", "PENDING_WORKS", "SIZE", "VERSION", "FlightRecord", "FlightState",
           "clock", "collective_names", "install", "read", "record_path"]

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
