"""Matchers for distributed set-up: the backend, DDP's device arguments, visible-devices variables.

Usage::

    from npu_migrate.port.matchers.distributed import match_backend
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from npu_migrate.port.context import Context, Hit
from npu_migrate.port.matchers.common import (
    arg, dotted, assign_target_names, is_add_argument, keyword_index, last_name, positional, replace_arg_value, string_value,
)
from npu_migrate.port.matchers.devices import availability_test

_BACKEND_NAME_RE = re.compile(r"backend", re.I)
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_ENVIRON_CALLS = ("os.environ.get", "os.environ.setdefault", "os.environ.pop", "os.getenv", "os.putenv",
                  "os.unsetenv", "os.environ.__contains__")


def _backend_value(node: cst.BaseExpression, ctx: Context, backend: str) -> Optional[cst.BaseExpression]:
    family = "cuda" if backend == "nccl" else "npu"
    if string_value(node) == backend:
        return ctx.emit("default_backend")
    if isinstance(node, cst.IfExp) and string_value(node.body) == backend:
        if string_value(node.orelse) == "gloo" and availability_test(node.test, ctx, family):
            return ctx.emit("default_backend")
        return node.with_changes(body=ctx.emit("default_backend"))
    return None


def match_backend(node: cst.CSTNode, ctx: Context, backend: str = "nccl") -> Optional[Hit]:
    """NM006 (``"nccl"``) and NM023 (``"hccl"``) as the backend of a process group."""
    if isinstance(node, (cst.Assign, cst.AnnAssign)):
        if node.value is None or not any(_BACKEND_NAME_RE.search(n) for n in assign_target_names(node)):
            return None
        value = _backend_value(node.value, ctx, backend)
        return Hit(node.with_changes(value=value)) if value is not None else None
    assert isinstance(node, cst.Call)
    new = node
    name = last_name(node.func)
    pos = positional(node)
    if name == "init_process_group" and pos:
        value = _backend_value(node.args[pos[0]].value, ctx, backend)
        if value is not None:
            new = replace_arg_value(new, pos[0], value)
    for i, a in enumerate(node.args):
        if a.keyword is None:
            continue
        kw = a.keyword.value
        if kw in ("backend", "dist_backend") or (kw == "default" and is_add_argument(node)):
            value = _backend_value(a.value, ctx, backend)
            if value is not None:
                new = replace_arg_value(new, i, value)
    return Hit(new) if new is not node else None


def match_nccl(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM006."""
    return match_backend(node, ctx, "nccl")


def match_ddp(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM007: DDP ``device_ids=[i]`` and ``output_device=i`` (the CPU needs ``None``)."""
    assert isinstance(node, cst.Call)
    text = dotted(node.func) or ""
    if not (text.endswith("DistributedDataParallel") or text.rpartition(".")[2] == "DDP"):
        return None
    qual = ctx.qualname(node.func) or ""
    if not (qual.endswith("DistributedDataParallel") or qual.rpartition(".")[2] == "DDP"):
        return None
    new = node
    pos = positional(node)
    slots = {"device_ids": keyword_index(node, "device_ids"), "output_device": keyword_index(node, "output_device")}
    if slots["device_ids"] is None and len(pos) > 1:
        slots["device_ids"] = pos[1]
    if slots["output_device"] is None and len(pos) > 2:
        slots["output_device"] = pos[2]
    i = slots["device_ids"]
    if i is not None:
        value = node.args[i].value
        if isinstance(value, (cst.List, cst.Tuple)) and len(value.elements) == 1 \
                and isinstance(value.elements[0], cst.Element):
            new = replace_arg_value(new, i, ctx.emit("device_ids", [arg(value.elements[0].value)]))
        elif isinstance(value, (cst.List, cst.Tuple)) and len(value.elements) > 1:
            return Hit(None, "DDP over several devices per process is not portable",
                       "use one process per device: device_ids=nm.device_ids(local_rank)")
    i = slots["output_device"]
    if i is not None:
        value = node.args[i].value
        if not (isinstance(value, cst.Name) and value.value == "None") and not ctx.is_emitted(value, "output_device"):
            if isinstance(value, (cst.Name, cst.Attribute, cst.Integer, cst.Subscript)):
                new = replace_arg_value(new, i, ctx.emit("output_device", [arg(value)]))
    return Hit(new) if new is not node else None


def match_visible_devices(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM010: ``os.environ["CUDA_VISIBLE_DEVICES"]`` and friends."""
    if isinstance(node, cst.Subscript):
        if not (dotted(node.value) or "").endswith("environ") or len(node.slice) != 1 or \
                ctx.qualname(node.value) != "os.environ":
            return None
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and string_value(index.value) == VISIBLE_DEVICES:
            return Hit(node.with_changes(slice=[node.slice[0].with_changes(slice=index.with_changes(
                value=ctx.emit("visible_devices_env")))]))
        return None
    if isinstance(node, cst.Comparison):
        if string_value(node.left) == VISIBLE_DEVICES and len(node.comparisons) == 1 \
                and isinstance(node.comparisons[0].operator, (cst.In, cst.NotIn)) \
                and ctx.qualname(node.comparisons[0].comparator) == "os.environ":
            return Hit(node.with_changes(left=ctx.emit("visible_devices_env")))
        return None
    assert isinstance(node, cst.Call)
    if node.args and string_value(node.args[0].value) == VISIBLE_DEVICES and ctx.qualname(node.func) in _ENVIRON_CALLS:
        return Hit(replace_arg_value(node, 0, ctx.emit("visible_devices_env")))
    return None


def match_nccl_env(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM111: ``NCCL_*`` variables configure NCCL only."""
    value = string_value(node)
    if value is not None and re.match(r"^NCCL_[A-Z0-9_]+$", value):
        hccl = "HCCL_" + value[5:]
        return Hit(None, f"{value} configures NCCL only", f"set the matching HCCL_* variable on Ascend (e.g. {hccl}) "
                   "and keep both if the code still runs on GPUs")
    return None
