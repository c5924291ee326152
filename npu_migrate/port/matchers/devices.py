"""Matchers for devices: ``.cuda()``, ``torch.device("cuda")``, device strings, ``is_cuda``.

Usage::

    from npu_migrate.port.matchers.devices import match_cuda_method

The same matchers port Ascend-only input (``.npu()``, ``"npu:0"``) when called for the ``npu``
family. A device without an index (``"cuda"``, ``.cuda()``) is the *current* device, as CUDA
means it, so it becomes the family name (``nm.device_type()``, which torch also takes as a
device) or ``torch.device(nm.device_type())``; ``"cuda:1"`` and ``.cuda(1)`` name an index. A value keeps the type the surrounding
code expects: a ``torch.device`` where torch takes the device, a ``str`` where user code gets it.
Integer ordinals (``.to(rank)``, ``device=local_rank``) are :mod:`.ordinals`.
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from npu_migrate.port.context import Context, Hit
from npu_migrate.port.matchers.common import (
    arg, assign_target_names, device_spec, dotted, index_args, is_add_argument, keyword_index,
    option_strings, positional, replace_arg_value, string_value,
)
from npu_migrate.port.torch_devices import DEVICE_METHODS

_DEVICE_NAME_RE = re.compile(r"(^|_)(device|dev)($|_)", re.I)
# Tensor and Module methods that take a device (torch.device or str): torch's, from its metadata.
_DEVICE_METHODS = frozenset({"to", "type"}) | DEVICE_METHODS
# Calls whose first positional argument is a device type string.
_DEVICE_TYPE_FIRST_ARG = ("torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.get_device_module")
_DEVICE_TYPE_FIRST_NAMES = frozenset(q.rpartition(".")[2] for q in _DEVICE_TYPE_FIRST_ARG)


def _is_device_expr(node: cst.BaseExpression, family: str) -> bool:
    """Whether ``node`` is a device string of ``family`` (or a conditional choosing one); no side effects."""
    if isinstance(node, cst.IfExp):
        return device_spec(node.body, family) is not None
    return device_spec(node, family) is not None


def availability_test(node: cst.BaseExpression, ctx: Context, family: str = "cuda") -> bool:
    """True for ``torch.cuda.is_available()`` (``torch.npu...``) or what this tool already wrote for it."""
    if not isinstance(node, cst.Call) or node.args:
        return False
    qual = ctx.qualname(node.func)
    return qual in (f"torch.{family}.is_available", f"torch_npu.{family}.is_available") or ctx.is_emitted(
        node, "accelerator_available")


def device_value(node: cst.BaseExpression, ctx: Context, as_str: bool, family: str = "cuda",
                 other: str = "cpu") -> Optional[cst.BaseExpression]:
    """The port of a device string in a device position, or ``None`` if it is not one.

    ``as_str`` keeps the value a ``str`` (for variables, argparse defaults and user functions);
    otherwise a ``torch.device`` is written. ``"cuda" if <available> else "cpu"`` is the device
    itself; with another condition only the ``"cuda"`` branch changes.
    """
    if isinstance(node, cst.IfExp):
        body_spec, else_value = device_spec(node.body, family), string_value(node.orelse)
        if body_spec is not None and else_value == other and availability_test(node.test, ctx, family):
            return _device(body_spec[0], ctx, as_str)
        new_body = device_value(node.body, ctx, as_str=True, family=family) if body_spec is not None else None
        if new_body is not None:
            return node.with_changes(body=new_body)
        return None
    spec = device_spec(node, family)
    if spec is None:
        return None
    return _device(spec[0], ctx, as_str)


def _device(index: Optional[cst.BaseExpression], ctx: Context, as_str: bool) -> cst.BaseExpression:
    # Without an index the family name is the current device, and torch takes it as a str as well.
    if index is None:
        return ctx.emit("device_type")
    return ctx.emit("device_str", index_args(index)) if as_str else ctx.emit("get_device", index_args(index))


# --------------------------------------------------------------------------- .cuda() / .npu()


def match_device_method(node: cst.Call, ctx: Context, family: str = "cuda") -> Optional[Hit]:
    """``x.cuda()``, ``x.cuda(i)``, ``x.cuda(non_blocking=True)`` -> ``x.to(<device>, ...)``."""
    func = node.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == family):
        return None
    if ctx.binding(func.value) == "import":
        return None  # torch.cuda(), numba.cuda(), torch.Tensor.cuda(t): a module or class, not a tensor
    if family in ctx.own_device_methods:
        return Hit(None, f"this file defines its own {family}() method, so .{family}() may not be torch's",
                   f"replace .{family}() on tensors and modules by .to(nm.get_device()) by hand")
    index: Optional[cst.BaseExpression] = None
    rest = []
    for a in node.args:
        if a.star:
            return None
        if a.keyword is None or a.keyword.value == "device":
            if index is not None:
                return None
            index = a.value
        elif a.keyword.value in ("non_blocking", "memory_format"):
            rest.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        else:
            return None
    if isinstance(index, cst.Name) and index.value == "None":
        index = None
    device = _device(index, ctx, as_str=False)
    new = node.with_changes(func=func.with_changes(attr=cst.Name("to")), args=[arg(device), *rest])
    return Hit(new)


def match_cuda_method(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM001."""
    assert isinstance(node, cst.Call)
    return match_device_method(node, ctx, "cuda")


# --------------------------------------------------------------------------- torch.device


def match_torch_device(node: cst.CSTNode, ctx: Context, family: str = "cuda") -> Optional[Hit]:
    """NM002: ``torch.device("cuda")``, ``torch.device("cuda", i)``, ``torch.device(f"cuda:{i}")``."""
    assert isinstance(node, cst.Call)
    if not node.args or (dotted(node.func) or "").rpartition(".")[2] != "device":
        return None
    if ctx.qualname(node.func) != "torch.device":
        return None
    pos = positional(node)
    type_i = pos[0] if pos else keyword_index(node, "type")
    if type_i is None:
        return None
    index_i = pos[1] if len(pos) > 1 else keyword_index(node, "index")
    if len(node.args) - (index_i is not None) != 1:
        return None
    value = node.args[type_i].value
    if index_i is not None:
        if string_value(value) != family:
            return None
        return Hit(ctx.emit("get_device", [arg(node.args[index_i].value)]))
    new = device_value(value, ctx, as_str=False, family=family)
    if new is None:
        return None
    if ctx.is_emitted(new, "device_type"):
        return Hit(ctx.emit("current_device"))  # torch.device("cuda"): still a torch.device
    if isinstance(value, cst.IfExp) and isinstance(new, cst.IfExp):
        return Hit(replace_arg_value(node, type_i, new))  # only the "cuda" branch changed
    return Hit(new)


# --------------------------------------------------------------------------- device strings


def _takes_torch_device(call: cst.Call, ctx: Context) -> bool:
    """Whether ``call``'s ``device=`` reaches torch (which takes a torch.device) rather than user code."""
    func = call.func
    qual = ctx.qualname(func) or ""
    if ctx.binding(func) == "import":
        return qual.split(".")[0] == "torch"
    return isinstance(func, cst.Attribute) and func.attr.value in _DEVICE_METHODS


def _match_device_string_call(node: cst.Call, ctx: Context, family: str) -> Optional[Hit]:
    new = node
    func = node.func
    pos = positional(node)
    # x.to("cuda"), x.to("cuda:1"), x.to(f"cuda:{rank}")
    if isinstance(func, cst.Attribute) and func.attr.value == "to" and pos:
        value = device_value(node.args[pos[0]].value, ctx, as_str=False, family=family)
        if value is not None:
            new = replace_arg_value(new, pos[0], value)
    if pos and string_value(node.args[pos[0]].value) == family and \
            (dotted(func) or "").rpartition(".")[2] in _DEVICE_TYPE_FIRST_NAMES and \
            ctx.qualname(func) in _DEVICE_TYPE_FIRST_ARG:
        new = replace_arg_value(new, pos[0], ctx.emit("device_type"))
    for i, a in enumerate(node.args):
        if a.keyword is None:
            continue
        name = a.keyword.value
        if name == "device":
            if not _is_device_expr(a.value, family):
                continue
            value = device_value(a.value, ctx, as_str=not _takes_torch_device(node, ctx), family=family)
        elif name == "device_type" and string_value(a.value) == family:
            value = ctx.emit("device_type")
        elif name == "default" and is_add_argument(node) and any(
            _DEVICE_NAME_RE.search(o.lstrip("-").replace("-", "_")) for o in option_strings(node)
        ):
            value = device_value(a.value, ctx, as_str=True, family=family)
        else:
            value = None
        if value is not None:
            new = replace_arg_value(new, i, value)
    return Hit(new) if new is not node else None


def match_device_string(node: cst.CSTNode, ctx: Context, family: str = "cuda") -> Optional[Hit]:
    """NM003: ``"cuda"`` strings used as devices, kept the type the code expects."""
    if isinstance(node, cst.Call):
        return _match_device_string_call(node, ctx, family)
    assert isinstance(node, (cst.Assign, cst.AnnAssign))
    if node.value is None or not any(_DEVICE_NAME_RE.search(n) for n in assign_target_names(node)):
        return None
    value = device_value(node.value, ctx, as_str=True, family=family)
    return Hit(node.with_changes(value=value)) if value is not None else None


# --------------------------------------------------------------------------- is_cuda

# Parents under which `a.device.type == t` needs no parentheses.
_NO_PARENS = (cst.If, cst.While, cst.Assert, cst.Assign, cst.AnnAssign, cst.Return, cst.BooleanOperation,
              cst.Arg, cst.Element, cst.IfExp, cst.Lambda, cst.Expr, cst.DictElement)


def match_is_device(node: cst.CSTNode, ctx: Context, family: str = "cuda") -> Optional[Hit]:
    """NM009: ``t.is_cuda`` -> ``t.device.type == nm.device_type()`` (not on the class ``torch.Tensor``)."""
    assert isinstance(node, cst.Attribute)
    if node.attr.value != f"is_{family}" or ctx.binding(node.value) == "import":
        return None
    left = cst.Attribute(value=cst.Attribute(value=node.value, attr=cst.Name("device")), attr=cst.Name("type"))
    comparison = cst.Comparison(left=left, comparisons=[cst.ComparisonTarget(cst.Equal(), ctx.emit("device_type"))])
    parent = ctx.parent
    if not (isinstance(parent, _NO_PARENS) or (isinstance(parent, cst.UnaryOperation)
                                               and isinstance(parent.operator, cst.Not))):
        comparison = comparison.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return Hit(comparison.with_changes(lpar=list(node.lpar) or comparison.lpar,
                                       rpar=list(node.rpar) or comparison.rpar))
