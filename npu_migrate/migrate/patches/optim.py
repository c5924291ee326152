"""Optimizers asked for ``fused=True``, on a target torch has no fused kernel for.

Usage::

    from npu_migrate.migrate.patches import optim

    optim.install()   # AdamW(params, fused=True) on the CPU simulation of torch < 2.4 runs unfused

A CUDA script asks for ``fused=True`` because CUDA has the kernel. On the CPU simulation, torch
before 2.4 has none, and the optimizer refuses at construction ("`fused=True` requires all the
params to be floating point Tensors of supported devices"). There, the optimizer is built as the
script would get it without the flag (the same update, in one kernel per parameter list or per
tensor instead of one fused kernel), and the report says so. On a torch with the CPU kernel, or
on an accelerator, the optimizer is left as asked.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from npu_migrate.migrate.callers import record
from npu_migrate.migrate.state import on_cpu, patch


def _fused_classes() -> list[type]:
    """torch.optim's optimizers whose constructor takes ``fused``."""
    found = []
    for value in vars(torch.optim).values():
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer:
            try:
                if "fused" in inspect.signature(value.__init__).parameters:
                    found.append(value)
            except (TypeError, ValueError):
                continue
    return found


def _unfused_on_refusal(cls: type) -> Any:
    init = cls.__init__

    def __init__(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        if not (kwargs.get("fused") and on_cpu()):
            init(self, params, *args, **kwargs)
            return
        if not isinstance(params, (torch.Tensor, list, tuple, dict)):
            params = list(params)  # a generator would be spent by the first try
        try:
            init(self, params, *args, **kwargs)
        except RuntimeError as exc:
            if "fused" not in str(exc):
                raise
            kwargs["fused"] = False
            init(self, params, *args, **kwargs)
            self._npu_migrate_unfused = True  # the audit records the fused kernel the NPU calls
            record(f"torch.optim.{cls.__name__}(fused=True)", "noop",
                   f"torch {torch.__version__} has no fused kernel on cpu: runs unfused")

    functools.update_wrapper(__init__, init)
    return __init__


def install() -> None:
    """Patch the constructor of every ``torch.optim`` optimizer that takes ``fused``."""
    for cls in _fused_classes():
        patch(cls, "__init__", _unfused_on_refusal(cls))
