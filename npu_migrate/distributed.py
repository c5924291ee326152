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

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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


# torch 2.1's ~ProcessGroupGloo takes the group's work lock while it holds the GIL, and the group's
# worker thread needs the GIL to free a finished collective's tensors under that lock. A group whose
# last reference dies mid-program (after destroy_process_group, once DDP lets go of it as the
# script's main() returns) then deadlocks the process on its way out: seen in about 1 run in 4 of a
# 2-rank gloo job on torch 2.1.2, never on 2.14. Groups are kept here instead, until the process
# ends, on the torch releases where this was seen or may be, in the launcher's workers only: they
# leave with os._exit, so no destructor runs at all. A plain process (torchrun's worker) that kept
# them would destroy them during interpreter finalization instead, where gloo's threads abort
# ("terminate called without an active exception").
_RETIRED: list[Any] = []
_RETIRE_BEFORE = (2, 5)


def _retire_groups() -> None:
    """Keep every live process group referenced until the process ends (torch < 2.5)."""
    if _device._release_tuple(torch.__version__) >= _RETIRE_BEFORE:
        return
    world = getattr(dist.distributed_c10d, "_world", None)
    _RETIRED.extend(getattr(world, "pg_map", {}) or {})


def keep_groups_on_destroy() -> None:
    """Make ``dist.destroy_process_group`` keep the groups it destroys alive (torch < 2.5).

    The launcher calls this in every worker before the script runs, so scripts that call
    ``dist.destroy_process_group()`` themselves are covered too (see ``_RETIRED``).
    """
    if _device._release_tuple(torch.__version__) >= _RETIRE_BEFORE:
        return
    original = dist.destroy_process_group
    if getattr(original, "_npu_migrate_keeps_groups", False):
        return

    def destroy_process_group(group: Any = None) -> None:
        _retire_groups()
        original(group)

    destroy_process_group.__doc__ = original.__doc__
    destroy_process_group._npu_migrate_keeps_groups = True  # type: ignore[attr-defined]
    dist.destroy_process_group = destroy_process_group
    dist.distributed_c10d.destroy_process_group = destroy_process_group


def destroy_distributed() -> None:
    """Tear down the default process group if there is one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
