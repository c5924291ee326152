"""Signatures as data: parameters read from source (``ast``) or from a live object, written and compared.

Usage::

    from npu_migrate.releases.signatures import format_parameters, parameters_of, same_parameters

    live = parameters_of(torch.npu.set_device)       # (Parameter('device', 'POSITIONAL_OR_KEYWORD'),)
    format_parameters(live)                           # "(device)"
    same_parameters(surface.resolve(release, "set_device").parameters, live)

:mod:`npu_migrate.releases.surface` reads a release's signatures from its source with these; a
default is kept as its source text and compared as a value where it is a literal (:func:`same_default`).
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Parameter:
    """One parameter of a signature.

    Attributes:
        name: as written.
        kind: ``inspect.Parameter`` kind name (``POSITIONAL_OR_KEYWORD``, ``KEYWORD_ONLY``...).
        default: the default's source text (``None``, ``'npu'``), or ``None`` when it has none.
    """

    name: str
    kind: str
    default: Optional[str] = None

    def text(self) -> str:
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(self.kind, "")
        return f"{prefix}{self.name}" + ("" if self.default is None else f"={self.default}")


def format_parameters(parameters: tuple[Parameter, ...]) -> str:
    """Parameters as a signature's text: ``(a, /, b=1, *args, c, **kw)``."""
    parts: list[str] = []
    kinds = [p.kind for p in parameters]
    for i, param in enumerate(parameters):
        if param.kind == "KEYWORD_ONLY" and "VAR_POSITIONAL" not in kinds[:i] and "KEYWORD_ONLY" not in kinds[:i]:
            parts.append("*")
        parts.append(param.text())
        if param.kind == "POSITIONAL_ONLY" and (i + 1 == len(parameters) or parameters[i + 1].kind != "POSITIONAL_ONLY"):
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


def from_arguments(args: ast.arguments, drop_first: bool) -> tuple[Parameter, ...]:
    """A ``def``'s parameters from its ``ast.arguments``; ``drop_first`` leaves out ``self``/``cls``."""
    positional = [(a, "POSITIONAL_ONLY") for a in args.posonlyargs] + [(a, "POSITIONAL_OR_KEYWORD") for a in args.args]
    defaults: list[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = [Parameter(a.arg, kind, None if d is None else ast.unparse(d)) for (a, kind), d in zip(positional, defaults)]
    if drop_first and out:
        out = out[1:]
    if args.vararg is not None:
        out.append(Parameter(args.vararg.arg, "VAR_POSITIONAL"))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out.append(Parameter(arg.arg, "KEYWORD_ONLY", None if default is None else ast.unparse(default)))
    if args.kwarg is not None:
        out.append(Parameter(args.kwarg.arg, "VAR_KEYWORD"))
    return tuple(out)


def parameters_of(obj: Any) -> Optional[tuple[Parameter, ...]]:
    """``obj``'s signature in :class:`Parameter` form (defaults as ``repr``), or ``None`` without one."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return tuple(
        Parameter(p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default))
        for p in signature.parameters.values()
    )


def same_default(source: Optional[str], live: Optional[str]) -> bool:
    """Whether a default written in the release's source and a live default (its ``repr``) agree.

    Literals are compared as values (``'npu'`` and ``"npu"``, ``2.0**16`` and ``65536.0``);
    anything else (``torch.float16``) by text.
    """
    if source is None or live is None:
        return source is live
    if source == live:
        return True
    try:
        return _value(source) == _value(live)
    except (ValueError, SyntaxError, TypeError):
        return False


def _value(text: str) -> Any:
    tree = ast.parse(text, mode="eval").body
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Pow):  # 2.**16 in GradScaler's defaults
        return _value(ast.unparse(tree.left)) ** _value(ast.unparse(tree.right))
    return ast.literal_eval(tree)


def same_parameters(release_params: tuple[Parameter, ...], live: tuple[Parameter, ...]) -> bool:
    """Names, kinds and defaults all agree, in order."""
    return len(release_params) == len(live) and all(
        a.name == b.name and a.kind == b.kind and same_default(a.default, b.default)
        for a, b in zip(release_params, live)
    )
