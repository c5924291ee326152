"""``torch.load``: CUDA locations in a checkpoint and in ``map_location`` land on the target.

Usage::

    from npu_migrate.migrate.patches import serialization

    serialization.install()   # torch.load(f) of a CUDA checkpoint restores onto the target

``map_location`` is mapped where the caller put it, by keyword or second positional argument;
the other arguments (``pickle_module`` third) go to torch as they came.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from npu_migrate.migrate.callers import record
from npu_migrate.migrate.mapping import map_device
from npu_migrate.migrate.state import patch


class _OntoTarget(dict):
    """``map_location`` for a ``torch.load`` that gave none: each CUDA location onto the target,
    every other as saved.

    A dict whose ``get`` maps, not a callable: torch refuses a callable ``map_location`` where it
    rebuilds a tensor from a CPU copy (``_rebuild_device_tensor_from_cpu_tensor``: a backend without
    storages, a wrapper subclass), and reads a dict's locations with ``get`` everywhere.
    """

    def get(self, location: Any, default: Any = None) -> Any:  # type: ignore[override]
        return str(map_device(location)) if isinstance(location, str) else default


def install() -> None:
    """Patch ``torch.load`` so a missing, CUDA or dict ``map_location`` restores onto the target."""
    load = torch.load
    restore = _OntoTarget()

    def torch_load(*args: Any, **kwargs: Any) -> Any:
        # torch.load(f, map_location=None, pickle_module=None, *, ...): map the second positional
        # where it stands, so a third (pickle_module) keeps its place.
        positional = len(args) >= 2
        where = args[1] if positional else kwargs.get("map_location")
        if where is None:
            mapped: Any = restore  # a CUDA checkpoint must not try to restore onto CUDA
        elif isinstance(where, dict):
            mapped = {k: (str(map_device(v)) if isinstance(v, str) else map_device(v)) for k, v in where.items()}
        elif callable(where):
            mapped = where
        else:
            mapped = map_device(where)
        if mapped is not where and where is not None:
            record("torch.load(map_location=)")
        if positional:
            return load(args[0], mapped, *args[2:], **kwargs)
        kwargs["map_location"] = mapped
        return load(*args, **kwargs)

    functools.update_wrapper(torch_load, load)
    patch(torch, "load", torch_load)
