"""Process-group set-up from torchrun-style environment variables.

Usage::

    import npu_migrate as nm

    info = nm.init_distributed()          # reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...
    model = DDP(model.to(info.device), device_ids=info.device_ids)
    ...
    nm.destroy_distributed()

Outside a job (no ``RANK``/``WORLD_SIZE``), :func:`init_distributed` starts a one-process group
on an in-memory store, so the same script runs as a plain ``python train.py`` with DDP,
collectives and samplers all working.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import types
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from npu_migrate import device as _device
from npu_migrate.errors import DistributedConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job.

    Attributes:
        rank: global rank.
        local_rank: rank on this node, also the index of its device.
        world_size: processes in the job.
        local_world_size: processes on this node.
        node_rank: index of this node.
        device_type: family (``npu``, ``cuda``, ``cpu``).
        backend: torch.distributed backend of the default group.
        device: the device bound to this process.
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device_type: str
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on global rank 0."""
        return self.rank == 0

    @property
    def device_ids(self) -> list[int] | None:
        """The ``device_ids`` argument DDP wants: ``[index]`` on an accelerator, ``None`` on CPU."""
        return None if self.device.index is None else [self.device.index]


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise DistributedConfigError(
            f"{name}={value!r} is not an integer. Launch with `python -m npu_migrate.launch` or "
            "torchrun, which set it, or fix the variable."
        ) from None


def _read_env() -> dict[str, int]:
    rank = _env_int("RANK", None)
    world_size = _env_int("WORLD_SIZE", None)
    if (rank is None) != (world_size is None):
        have, missing = ("RANK", "WORLD_SIZE") if rank is not None else ("WORLD_SIZE", "RANK")
        raise DistributedConfigError(
            f"{have} is set but {missing} is not. Set both (the launcher and torchrun do), or neither "
            "to run as a single process."
        )
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise DistributedConfigError(
            f"RANK={rank} and WORLD_SIZE={world_size} are inconsistent: expected 0 <= RANK < WORLD_SIZE."
        )
    local_rank = _env_int("LOCAL_RANK", 0 if world_size == 1 else None)
    if local_rank is None:
        raise DistributedConfigError(
            f"WORLD_SIZE={world_size} but LOCAL_RANK is not set, so the device of this process is "
            "unknown. Launch with `python -m npu_migrate.launch` or torchrun, which set it."
        )
    if local_rank < 0:
        raise DistributedConfigError(f"LOCAL_RANK={local_rank} is negative: expected 0 <= LOCAL_RANK.")
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    node_rank = _env_int("GROUP_RANK", _env_int("NODE_RANK", rank // max(local_world_size, 1)))
    return {
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "local_world_size": local_world_size,
        "node_rank": node_rank,
    }


def init_distributed(
    device: str | None = None,
    backend: str | None = None,
    timeout: timedelta | float | None = None,
) -> DistInfo:
    """Bind this process's device and initialise the default process group.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (or
    ``NODE_RANK``), ``MASTER_ADDR`` and ``MASTER_PORT`` as torchrun sets them. Calling it again
    returns the same answer without touching the group.

    Args:
        device: force a family; it is also exported as ``NPU_MIGRATE_DEVICE`` so later calls
            and child processes agree.
        backend: override the family's backend (``hccl``, ``nccl``, ``gloo``).
        timeout: collective timeout, as a ``timedelta`` or seconds; torch's default otherwise.

    Returns:
        Ranks, sizes, backend and bound device of this process.

    Raises:
        DistributedConfigError: the environment is incomplete or inconsistent.
        DeviceUnavailableError: the forced family cannot be used here.
    """
    selection = _device.resolve_device(device)
    spec = selection.spec
    if selection.source == "argument":
        os.environ[_device.ENV_DEVICE] = spec.name
    for note in selection.skipped:
        logger.warning("%s", note)
    env = _read_env()
    local_rank = env["local_rank"]
    if spec.is_accelerator and not dist.is_initialized():
        count = _device.device_count()
        if local_rank >= count:
            mask = os.environ.get(spec.visible_devices_env or "")
            seen = f" ({spec.visible_devices_env}={mask!r})" if mask is not None else ""
            raise DistributedConfigError(
                f"LOCAL_RANK={local_rank} but this process sees only {count} {spec.name} device(s){seen}. "
                f"Start at most {count} processes per node (--device-num {count})."
            )
        _device.set_device(local_rank)
    bound = _device.get_device(local_rank)

    if not dist.is_initialized():
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        kwargs = {} if timeout is None else {"timeout": timeout}
        name = backend or _device.default_backend(spec)
        if env["world_size"] == 1 and "MASTER_ADDR" not in os.environ:
            # One process, no rendezvous to do: an in-memory store needs no port.
            dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
        else:
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
            if missing:
                raise DistributedConfigError(
                    f"{' and '.join(missing)} not set for a job of WORLD_SIZE={env['world_size']}. "
                    "Launch with `python -m npu_migrate.launch` or torchrun, or set them to rank 0's "
                    "address and a free port."
                )
            dist.init_process_group(
                name, init_method="env://", rank=env["rank"], world_size=env["world_size"], **kwargs
            )
        logger.debug("joined %s group as rank %d of %d", name, env["rank"], env["world_size"])

    return DistInfo(
        rank=dist.get_rank(),
        local_rank=local_rank,
        world_size=dist.get_world_size(),
        local_world_size=env["local_world_size"],
        node_rank=env["node_rank"],
        device_type=spec.name,
        backend=str(dist.get_backend()),
        device=bound,
    )


# Before torch 2.8 (pytorch/pytorch#154976), the Python binding of ProcessGroup freed the group with
# the GIL held. Freeing it frees its backend, and ~ProcessGroupGloo joins the backend's worker
# threads; a worker that is still freeing a finished collective's tensors needs the GIL to drop
# their Python objects, and it does so under the lock the join is waiting on. So a script whose
# last collective finished a moment before it destroyed its group could hang forever on its way
# out: about 1 run in 3 of the 2-rank regression example under torchrun on torch 2.1.2, and every
# time within 20 init/all_reduce/destroy rounds. The backends' own bindings release the GIL when
# they free them, so the safe teardown holds each backend while the group is destroyed and lets it
# go afterwards, from Python: its threads then stop without the GIL held. A group that outlives
# its destruction (a DDP model still holds it) keeps its backends until the process exits.
_GIL_FREE_TEARDOWN = (2, 8)
_HELD: list[list[Any]] = []  # the backends of destroyed groups that something still holds


def _needs_safe_teardown() -> bool:
    return _device._release_tuple(torch.__version__) < _GIL_FREE_TEARDOWN


def _backends(group: Any) -> list[Any]:
    """The backend objects a process group owns, one per device type it serves."""
    held = []
    for device_type in getattr(group, "_device_types", ()) or ():
        try:
            held.append(group._get_backend(torch.device(device_type)))
        except (RuntimeError, ValueError):
            pass
    return held


def _destroy_safely(destroy: Any, group: Any = None) -> None:
    """Run torch's ``destroy_process_group`` so that no backend is freed with the GIL held."""
    world = getattr(dist.distributed_c10d, "_world", None)
    groups = list(getattr(world, "pg_map", {}) or {}) if group is None else [group]
    kept = [(weakref.ref(g), _backends(g)) for g in groups]
    del groups
    destroy(group)
    outlived = [backends for ref, backends in kept if ref() is not None]  # DDP still holds them
    if outlived:
        if not _HELD:
            atexit.register(_HELD.clear)  # freed at exit, while the interpreter is whole
        _HELD.extend(outlived)
    # The other backends are freed as this returns, each by its own binding, which releases the GIL.


def guarded_destroy(original: Callable[..., None]) -> Callable[..., None] | None:
    """``original`` (torch's ``destroy_process_group``) made to free backends without the GIL held.

    None where torch needs no guard (2.8 and newer) or ``original`` is already guarded.
    """
    if not _needs_safe_teardown() or getattr(original, "_npu_migrate_guarded", False):
        return None

    def destroy_process_group(group: Any = None) -> None:
        _destroy_safely(original, group)

    functools.update_wrapper(destroy_process_group, original)
    destroy_process_group._npu_migrate_guarded = True  # type: ignore[attr-defined]
    return destroy_process_group


def guard_destroy_process_group() -> None:
    """Install :func:`guarded_destroy` as ``dist.destroy_process_group`` (torch < 2.8).

    The launcher's workers call this before the script runs, so scripts that call
    ``dist.destroy_process_group()`` themselves are covered too (``npu-migrate run`` installs the
    same through its own patches, so that it can take them back).
    """
    guarded = guarded_destroy(dist.destroy_process_group)
    if guarded is not None:
        dist.destroy_process_group = guarded
        dist.distributed_c10d.destroy_process_group = guarded


def destroy_distributed() -> None:
    """Tear down every process group, if there is one (safely on torch < 2.8, see above)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    (guarded_destroy(dist.destroy_process_group) or dist.destroy_process_group)()


# torch's own functions that take ``group=group.WORLD`` evaluate it when their module is imported:
# torch.distributed.nn.functional (all_reduce, broadcast...: torch._dynamo imports it, and building a
# DistributedDataParallel imports torch._dynamo), ZeroRedundancyOptimizer's _broadcast_object,
# ShardedGradScaler.__init__. Imported after init_process_group, each default argument is the
# default group itself, so destroy_process_group() can never free it. On torch 2.14 its gloo worker
# threads, transport loop and store server then live on while the interpreter finalizes and the
# process exits, every time, in every script that builds its DDP model after joining the group
# (measured: after init, DDP, destroy and gc.collect(), ~ProcessGroupGloo never runs; on torch 2.1
# to 2.7 destroy_process_group stops the threads and only the object lives on). Before init the
# same default is None, which every one of them reads as "the default group".
_GROUP_DEFAULTS_IN = "torch.distributed"


def _functions_of(module: Any) -> list[Any]:
    """The module's functions and those of the classes it defines (plain, static and class methods)."""
    found = []
    for value in list(vars(module).values()):  # type() only: a deprecated name warns when asked its class
        if type(value) is types.FunctionType:
            found.append(value)
        elif issubclass(type(value), type) and getattr(value, "__module__", None) == module.__name__:
            members = list(vars(value).values())
            found.extend(v.__func__ if type(v) in (staticmethod, classmethod) else v for v in members)
    return [f for f in found if type(f) is types.FunctionType]


def release_group_defaults() -> list[Any]:
    """Give torch's ``group=group.WORLD`` defaults back the value they have before init: None.

    Only once no group is left (after :func:`destroy_distributed`); returns the groups let go.
    """
    if not dist.is_available() or dist.is_initialized():
        return []
    released: list[Any] = []

    def stale(value: Any) -> bool:
        if isinstance(value, dist.ProcessGroup):
            if not any(value is r for r in released):
                released.append(value)
            return True
        return False

    for name, module in list(sys.modules.items()):
        if module is None or not (name == _GROUP_DEFAULTS_IN or name.startswith(_GROUP_DEFAULTS_IN + ".")):
            continue
        for function in _functions_of(module):
            defaults, keywords = function.__defaults__, function.__kwdefaults__
            if defaults and any([stale(d) for d in defaults]):
                function.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d for d in defaults)
            if keywords and any([stale(v) for v in keywords.values()]):
                function.__kwdefaults__ = {k: None if isinstance(v, dist.ProcessGroup) else v
                                           for k, v in keywords.items()}
    return released


def teardown_at_exit() -> None:
    """Destroy what is left and free held backends while Python is whole (see :mod:`npu_migrate._exit`)."""
    import gc

    destroy_distributed()
    released = release_group_defaults()
    # Where the binding frees a group with the GIL held (torch < 2.8), its backends are freed last, from here.
    held = [_backends(group) for group in released] if released and _needs_safe_teardown() else []
    del released
    _HELD.clear()
    gc.collect()  # a DDP model left in a reference cycle lets go of its group here
    held.clear()
