"""``npu-migrate ops --meta``: the device's tensors live on torch's ``meta`` device (shapes, no storage).

Usage::

    from npu_migrate.ops import meta

    args, kwargs = meta.swap(args, kwargs, target)     # the audited device becomes torch.device("meta")
    meta.stand_in("item", loss)                        # 0.0: what a host read of a meta tensor returns

A model too big for this machine's memory can still be audited: every tensor sent to the device
(``x.cuda()``, ``torch.zeros(..., device="cuda")``, ``model.cuda()``) is made on the ``meta`` device,
whose kernels compute shapes and dtypes only, and the dispatch mode records the same operators.
What the host reads back (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(x)``) has no value there:
the audit counts it as a synchronisation and hands the script zeros of the right type and shape, so
its numbers (losses, accuracies) are meaningless and a branch on them takes the zero side. An
operator with no meta kernel ends the script; the report then covers what ran before it.
"""

from __future__ import annotations

from typing import Any

import torch

META = torch.device("meta")

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
"""Tensor methods that read a meta tensor's (absent) values on the host."""


def swap(args: tuple, kwargs: dict, target: Any) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with the audited device's object (``target``) replaced by the meta device."""
    return (tuple(META if a is target else a for a in args),
            {k: META if v is target else v for k, v in kwargs.items()})


def stand_in(name: str, tensor: torch.Tensor) -> Any:
    """What ``tensor.<name>()`` gives the script for a meta tensor: zeros of the right type and shape."""
    host = torch.zeros(tensor.shape, dtype=tensor.dtype)
    if name == "cpu":
        return host
    if name == "numpy":
        return host.numpy()
    if name == "tolist":
        return host.tolist()
    if name == "__bool__":
        return False
    if name in ("__int__", "__index__"):
        return 0
    if name == "__float__":
        return 0.0
    return host.item() if host.numel() == 1 else host.tolist()
