"""Matchers for integer device ordinals (NM011): ``0``, ``rank``, ``local_rank`` wherever torch takes a device.

Usage::

    from npu_migrate.port.matchers.ordinals import is_ordinal, match_ordinal

An integer where torch takes a device is a CUDA ordinal: ``torch.device(0)`` is ``cuda:0`` and
``torch.ones(1, device=local_rank)`` asks for the NVIDIA driver. Each becomes ``nm.get_device(i)``:
device ``i`` of the family this run uses, the CPU on the CPU. An expression is taken as an ordinal
when its form says so (:func:`is_ordinal`): an int literal, a name whose last part names an index
(``rank``, ``local_rank``, ``ddp_local_rank``, ``gpu``, ``gpu_id``, ``device_id``, ``args.gpu``,
``self.local_rank``), ``int(...)``,
or one of those ``% n``. The places are ``.to(i)`` / ``.to(device=i)``, ``torch.device(i)``, the
``device`` of every torch call that takes one (:mod:`npu_migrate.port.torch_devices`, generated
from torch's metadata: factories, ``torch.Generator``, ``nn`` modules, ``x.new_zeros``,
``model.to_empty``...) and ``torch.load``'s ``map_location`` (an int, or the values of a dict).
``.cuda(i)``, ``torch.cuda.set_device(i)`` and DDP's ``device_ids``/``output_device`` have rules
of their own (NM001, NM004, NM007).
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from npu_migrate.port.context import Context, Hit
from npu_migrate.port.matchers.common import arg, dotted, keyword_index, last_name, positional, replace_arg_value
from npu_migrate.port.torch_devices import (
    DEVICE_FIRST_FUNCTIONS, DEVICE_FIRST_METHODS, DEVICE_FUNCTIONS, DEVICE_METHODS,
)

# Names that hold an integer device index in real code: rank, local_rank, gpu, gpu_id, args.gpu, nanoGPT's
# ddp_local_rank, the DDP tutorial's device_id (rank % torch.cuda.device_count())...
_INDEX_NAME_RE = re.compile(r"^(\w+_)?(local_|global_)?(rank|gpu)(_?(id|idx|index|num))?$|^gpu\d*$"
                            r"|^(device|dev|cuda)_?(id|idx|index|num|ordinal)$", re.I)
_LAST_NAMES = frozenset(n.rpartition(".")[2] for n in DEVICE_FUNCTIONS)
_FIRST_LAST_NAMES = frozenset(n.rpartition(".")[2] for n in DEVICE_FIRST_FUNCTIONS)
_INT_MAP_LOCATION = ("torch.load calls a map_location that is not a device, str or dict, so an int fails "
                     "there (TypeError); written as the device it names")

# Text the prefilter looks for: an ordinal right after a place that takes a device.
_ORDINAL_TEXT = r"\(?\s*(?:\d|int\s*\(|[\w.]*(?i:rank|gpu|id|idx|index|num|ordinal))"
TRIGGERS: tuple[str, ...] = (
    rf"\.to\({_ORDINAL_TEXT}",
    rf"\bdevice\s*=\s*{_ORDINAL_TEXT}",
    rf"\bdevice\({_ORDINAL_TEXT}",
    rf"\bmap_location\s*=\s*(?:{_ORDINAL_TEXT}|\{{)",
    rf"\bload\([^()]*,{_ORDINAL_TEXT}",
    r"\b(?:" + "|".join(sorted(_FIRST_LAST_NAMES | DEVICE_FIRST_METHODS)) + rf")\({_ORDINAL_TEXT}",
)


def is_ordinal(node: cst.BaseExpression, ctx: Context) -> bool:
    """Whether ``node`` is, by its form, an integer device index: ``2``, ``rank``, ``args.gpu``, ``int(...)``,
    ``rank % n``."""
    if isinstance(node, cst.Integer):
        return True
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, cst.Modulo) and is_ordinal(node.left, ctx)
    if isinstance(node, cst.Call):
        return (isinstance(node.func, cst.Name) and node.func.value == "int" and len(node.args) == 1
                and ctx.binding(node.func) == "none")
    name = last_name(node)
    return (name is not None and _INDEX_NAME_RE.match(name) is not None and dotted(node) is not None
            and ctx.binding(node) != "import")


def _device(node: cst.BaseExpression, ctx: Context) -> cst.BaseExpression:
    return ctx.emit("get_device", [arg(node)])


def _match_to(node: cst.Call, ctx: Context) -> Optional[cst.Call]:
    """``.to(rank)``, ``.to(rank, non_blocking=True)``, ``.to(device=rank)``."""
    if not node.args:
        return None
    a = node.args[0]
    if a.keyword is None and not a.star:
        if any(b.keyword is None for b in node.args[1:]):
            return None  # .to(rank, dtype) is not a device move we can be sure of
        return replace_arg_value(node, 0, _device(a.value, ctx)) if is_ordinal(a.value, ctx) else None
    i = keyword_index(node, "device")
    if i is not None and is_ordinal(node.args[i].value, ctx):
        return replace_arg_value(node, i, _device(node.args[i].value, ctx))
    return None


def _match_torch_device(node: cst.Call, ctx: Context) -> Optional[cst.BaseExpression]:
    """``torch.device(0)``, ``torch.device(local_rank)``: CUDA's device of that index."""
    if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
        return None
    value = node.args[0].value
    if not is_ordinal(value, ctx) or ctx.qualname(node.func) != "torch.device":
        return None
    return ctx.emit("get_device", list(node.args), keep_call=node)  # the argument's comments kept


def _match_map_location(node: cst.Call, ctx: Context) -> tuple[Optional[cst.Call], str]:
    """``torch.load(f, map_location=rank)`` (or positional), and ``{"cuda:0": rank}`` dict values."""
    i = keyword_index(node, "map_location")
    if i is None:
        pos = positional(node)
        i = pos[1] if len(pos) > 1 else None
    if i is None:
        return None, ""
    value = node.args[i].value
    if not (isinstance(value, cst.Dict) or is_ordinal(value, ctx)) or ctx.qualname(node.func) != "torch.load":
        return None, ""
    if not isinstance(value, cst.Dict):
        return replace_arg_value(node, i, _device(value, ctx)), _INT_MAP_LOCATION
    elements = [el.with_changes(value=ctx.emit("device_str", [arg(el.value)]))
                if isinstance(el, cst.DictElement) and is_ordinal(el.value, ctx) else el for el in value.elements]
    if all(new is old for new, old in zip(elements, value.elements)):
        return None, ""
    return (replace_arg_value(node, i, value.with_changes(elements=elements)),
            "map_location's values are device strings: an int one is written as the device it names")


def _match_device_argument(node: cst.Call, ctx: Context) -> Optional[cst.Call]:
    """``device=rank`` (or a leading positional device) of a torch call that takes a device."""
    func = node.func
    method = func.attr.value if isinstance(func, cst.Attribute) else None
    last = (dotted(func) or "").rpartition(".")[2]
    i = keyword_index(node, "device")
    if i is None and (method in DEVICE_FIRST_METHODS or last in _FIRST_LAST_NAMES):
        pos = positional(node)
        i = pos[0] if pos and pos[0] == 0 else None
    # Names are resolved last, and only for a call that has an ordinal where a device may be.
    if i is None or not (method in DEVICE_METHODS or last in _LAST_NAMES) or not is_ordinal(node.args[i].value, ctx):
        return None
    if method in DEVICE_METHODS and ctx.binding(func) != "import":
        first = method in DEVICE_FIRST_METHODS  # x.new_zeros(..., device=rank), model.to_empty(device=rank)
    elif ctx.binding(func) == "import" and ctx.qualname(func) in DEVICE_FUNCTIONS:
        first = ctx.qualname(func) in DEVICE_FIRST_FUNCTIONS
    else:
        return None
    if node.args[i].keyword is None and not first:
        return None
    return replace_arg_value(node, i, _device(node.args[i].value, ctx))


def match_ordinal(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM011: an integer device ordinal where torch takes a device."""
    assert isinstance(node, cst.Call)
    func = node.func
    if not node.args:
        return None
    if isinstance(func, cst.Attribute) and func.attr.value == "to":
        new = _match_to(node, ctx)
        return Hit(new) if new is not None else None
    last = (dotted(func) or "").rpartition(".")[2]
    if last == "device":
        device = _match_torch_device(node, ctx)
        return Hit(device) if device is not None else None
    if last == "load":
        new, message = _match_map_location(node, ctx)
        return Hit(new, message) if new is not None else None
    new = _match_device_argument(node, ctx)
    return Hit(new) if new is not None else None
