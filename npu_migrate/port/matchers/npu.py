"""Matchers for Ascend-only input: ``import torch_npu``, ``transfer_to_npu``, ``torch.npu.*``, ``"npu:N"``, ``"hccl"``.

Usage::

    from npu_migrate.port.matchers.npu import match_npu_import

Code written for Ascend (by hand, or by Ascend's own converter) ports to the same
device-neutral code as CUDA code does. ``import torch_npu`` and ``from torch_npu.contrib import
transfer_to_npu`` are dropped once nothing else uses them: npu_migrate loads torch_npu when the NPU
family is selected, and torch >= 2.5 loads it through its device-extension entry point.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from npu_migrate.port.context import Context, Hit, dotted
from npu_migrate.port.matchers.api import match_amp, match_api
from npu_migrate.port.matchers.devices import match_device_method, match_device_string, match_is_device, \
    match_torch_device
from npu_migrate.port.matchers.distributed import match_backend


def match_npu_import(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM020: ``import torch_npu`` and ``from torch_npu.contrib import transfer_to_npu``."""
    names: list[str] = []
    if isinstance(node, cst.Import):
        names = [n for a in node.names if (n := dotted(a.name)) is not None]
    elif isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None \
            and not isinstance(node.names, cst.ImportStar):
        module = dotted(node.module) or ""
        names = [f"{module}.{a.name.value}" for a in node.names if isinstance(a.name, cst.Name)]
    if not any(n == "torch_npu" or n.startswith("torch_npu.") for n in names):
        return None
    ctx.drop_import(node)
    what = "transfer_to_npu (CUDA calls redirected at run time)" if any(n.endswith("transfer_to_npu")
                                                                         for n in names) else "torch_npu"
    return Hit(node, f"{what} is dropped where nothing else uses it: the ported code selects its device itself")


def match_npu_api(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM021: ``torch.npu.*`` / ``torch_npu.npu.*`` calls, as NM004 and NM005 port ``torch.cuda.*``."""
    return match_api(node, ctx, ("npu",)) or match_amp(node, ctx, ("npu",))


def match_npu_device(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM022: ``.npu()``, ``torch.device("npu")``, ``"npu:N"`` and ``is_npu``."""
    if isinstance(node, cst.Attribute):
        return match_is_device(node, ctx, "npu")
    if isinstance(node, cst.Call):
        hit = match_device_method(node, ctx, "npu") or match_torch_device(node, ctx, "npu")
        if hit is not None:
            return hit
    return match_device_string(node, ctx, "npu")


def match_hccl(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM023: ``"hccl"`` as the backend."""
    return match_backend(node, ctx, "hccl")
