"""Matchers for checkpoints: ``torch.load(..., map_location=...)`` with CUDA devices.

Usage::

    from npu_migrate.port.matchers.checkpoint import match_map_location
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from npu_migrate.port.context import Context, Hit
from npu_migrate.port.matchers.common import arg, dotted, keyword_index, positional, replace_arg_value, snippet
from npu_migrate.port.matchers.devices import device_value


def _map_location_value(value: cst.BaseExpression, ctx: Context) -> tuple[Optional[cst.BaseExpression], str]:
    if isinstance(value, cst.Dict):
        elements = []
        changed = False
        for el in value.elements:
            if isinstance(el, cst.DictElement):
                new = device_value(el.value, ctx, as_str=True)
                if new is not None:
                    el = el.with_changes(value=new)
                    changed = True
            elements.append(el)
        return (value.with_changes(elements=elements) if changed else None), ""
    if isinstance(value, cst.Lambda):
        params = value.params.params
        body = value.body
        if params and isinstance(body, cst.Call) and isinstance(body.func, cst.Attribute) \
                and isinstance(body.func.value, cst.Name) and body.func.value.value == params[0].name.value:
            attr = body.func.attr.value
            if attr == "cuda" and len(body.args) <= 1 and all(a.keyword is None for a in body.args):
                if body.args:
                    return ctx.emit("get_device", [arg(a.value) for a in body.args]), ""
                return ctx.emit("device_type"), ""
            # NM001 already turned `storage.cuda(i)` into `storage.to(<device>)`
            if attr == "to" and len(body.args) == 1 and (
                    ctx.is_emitted(body.args[0].value, "get_device") or ctx.is_emitted(body.args[0].value,
                                                                                      "device_type")):
                return body.args[0].value, ""
        if "cuda" in snippet(value):
            return None, "a map_location function that mentions cuda cannot be rewritten safely"
        return None, ""
    return device_value(value, ctx, as_str=False), ""


def match_map_location(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM008."""
    assert isinstance(node, cst.Call)
    i = keyword_index(node, "map_location")
    if i is None and (dotted(node.func) or "").rpartition(".")[2] == "load" and ctx.qualname(node.func) == "torch.load":
        pos = positional(node)
        i = pos[1] if len(pos) > 1 else None
    if i is None:
        return None
    value, problem = _map_location_value(node.args[i].value, ctx)
    if problem:
        return Hit(None, problem, "pass map_location=nm.get_device() (or a dict of str(nm.get_device(i)) values)")
    return Hit(replace_arg_value(node, i, value)) if value is not None else None
