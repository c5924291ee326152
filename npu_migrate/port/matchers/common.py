"""Helpers the matchers share: literal strings, device strings, arguments and dotted names.

Usage::

    from npu_migrate.port.matchers.common import device_spec, string_value

    device_spec(cst.parse_expression('"cuda:1"'), "cuda")   # (Integer("1"),)
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import libcst as cst

from npu_migrate.port.context import dotted

__all__ = [
    "arg", "device_spec", "dotted", "index_args", "keyword_index", "last_name", "positional", "replace_arg_value",
    "snippet", "string_value", "to_keywords",
]

_FAMILY_RE = {family: re.compile(rf"^{family}(?::(\d+))?$") for family in ("cuda", "npu")}
_FMT_RE = {family: re.compile(rf"^{family}:(%d|%s|%i|\{{\}}|\{{0\}})$") for family in ("cuda", "npu")}


def string_value(node: cst.CSTNode) -> Optional[str]:
    """The value of a plain string literal, or ``None`` for anything else (bytes, f-strings...)."""
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - malformed escapes: not a literal we understand
            return None
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_value(node.left), string_value(node.right)
        return None if left is None or right is None else left + right
    return None


def is_device_literal(value: str, family: str) -> bool:
    """Whether ``value`` is ``"cuda"`` / ``"cuda:N"`` (or the ``npu`` spelling)."""
    return _FAMILY_RE[family].match(value) is not None


def device_spec(node: cst.BaseExpression, family: str = "cuda") -> Optional[tuple[Optional[cst.BaseExpression]]]:
    """Parse a device of ``family`` written as a string.

    Returns ``(index,)`` for ``"cuda"`` (index ``None``), ``"cuda:1"``, ``f"cuda:{i}"``,
    ``"cuda:%d" % i``, ``"cuda:{}".format(i)`` and ``"cuda:" + str(i)``; ``None`` otherwise.
    """
    value = string_value(node)
    if value is not None:
        m = _FAMILY_RE[family].match(value)
        if m is None:
            return None
        return (None if m.group(1) is None else cst.Integer(m.group(1)),)
    prefix = family + ":"
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        if (
            len(parts) == 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == prefix
            and isinstance(parts[1], cst.FormattedStringExpression)
            and parts[1].conversion is None
            and parts[1].format_spec is None
        ):
            return (parts[1].expression,)
        return None
    if isinstance(node, cst.BinaryOperation):
        left = string_value(node.left)
        if isinstance(node.operator, cst.Modulo) and left is not None and _FMT_RE[family].match(left):
            right = node.right
            if isinstance(right, cst.Tuple) and len(right.elements) == 1:
                right = right.elements[0].value
            return (right,)
        if isinstance(node.operator, cst.Add) and left == prefix:
            right = node.right
            if isinstance(right, cst.Call) and isinstance(right.func, cst.Name) and right.func.value == "str" \
                    and len(right.args) == 1:
                right = right.args[0].value
            return (right,)
        return None
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "format"
        and len(node.args) == 1
        and node.args[0].keyword is None
        and node.args[0].star == ""
    ):
        fmt = string_value(node.func.value)
        if fmt is not None and _FMT_RE[family].match(fmt):
            return (node.args[0].value,)
    return None


def arg(value: cst.BaseExpression) -> cst.Arg:
    """A positional argument."""
    return cst.Arg(value=value)


def index_args(index: Optional[cst.BaseExpression]) -> list[cst.Arg]:
    """``[index]`` as arguments, or none."""
    return [] if index is None else [arg(index)]


def keyword_index(call: cst.Call, name: str) -> Optional[int]:
    """The position of keyword argument ``name`` in ``call``, or ``None``."""
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value == name:
            return i
    return None


def positional(call: cst.Call) -> list[int]:
    """The positions of ``call``'s plain positional arguments."""
    return [i for i, a in enumerate(call.args) if a.keyword is None and a.star == ""]


def replace_arg_value(call: cst.Call, index: int, value: cst.BaseExpression) -> cst.Call:
    """``call`` with the value of argument ``index`` replaced."""
    args = list(call.args)
    args[index] = args[index].with_changes(value=value)
    return call.with_changes(args=args)


def last_name(node: cst.BaseExpression) -> Optional[str]:
    """``c`` for ``c`` and ``a.b.c``."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def snippet(node: cst.CSTNode) -> str:
    """The code of ``node`` on one line."""
    return " ".join(cst.Module(body=[]).code_for_node(node).split())


def option_strings(call: cst.Call) -> list[str]:
    """The literal positional strings of a call (argparse's option strings)."""
    return [v for a in call.args if a.keyword is None and (v := string_value(a.value)) is not None]


def is_add_argument(call: cst.Call) -> bool:
    """Whether ``call`` is ``<parser>.add_argument(...)``."""
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"


def to_keywords(call: cst.Call, names: Sequence[str]) -> Optional[list[cst.Arg]]:
    """The call's arguments with positional ones named after ``names``; ``None`` if it has *args."""
    out = []
    pos = 0
    for a in call.args:
        if a.star:
            return None
        if a.keyword is None:
            if pos >= len(names):
                return None
            a = a.with_changes(
                keyword=cst.Name(names[pos]),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            )
            pos += 1
        out.append(a)
    return out


def assign_target_names(node: cst.CSTNode) -> list[str]:
    """The last names of an assignment's targets (``args.device`` -> ``device``)."""
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, cst.AnnAssign):
        targets = [node.target]
    else:
        return []
    return [n for t in targets if (n := last_name(t)) is not None]
