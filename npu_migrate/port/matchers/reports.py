"""Report-only matchers: what has no automatic port (extensions, apex, CuPy, Triton, float64, ...).

Usage::

    from npu_migrate.port.matchers.reports import reference_matcher

    match = reference_matcher(("apex",), "{name} is NVIDIA apex, built for CUDA")
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from npu_migrate.port.context import Context, Hit, Matcher
from npu_migrate.port.matchers.common import dotted, is_device_literal, string_value


def _imported_names(node: cst.CSTNode) -> list[str]:
    """The full names an import statement brings in (``a.b`` for ``import a.b``; ``a.b.c`` for
    ``from a.b import c``)."""
    from npu_migrate.port.context import dotted

    if isinstance(node, cst.Import):
        return [n for a in node.names if (n := dotted(a.name)) is not None]
    if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
        module = dotted(node.module)
        if module is None:
            return []
        if isinstance(node.names, cst.ImportStar):
            return [module]
        return [f"{module}.{a.name.value}" for a in node.names if isinstance(a.name, cst.Name)]
    return []


def _bound_names(node: cst.CSTNode, prefixes: tuple[str, ...]) -> set[str]:
    """The local names an import binds to something under ``prefixes`` (``import cupy as cp`` -> cp)."""
    out: set[str] = set()
    if isinstance(node, cst.Import):
        for alias in node.names:
            full = dotted(alias.name) or ""
            if alias.asname is not None and any(full == p or full.startswith(p + ".") for p in prefixes):
                out.add(alias.evaluated_alias)  # import cupy as cp: cp is cupy
    elif isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None \
            and not isinstance(node.names, cst.ImportStar):
        module = dotted(node.module) or ""
        for alias in node.names:
            full = f"{module}.{alias.evaluated_name}"
            if any(full == p or full.startswith(p + ".") for p in prefixes):
                out.add(alias.evaluated_alias or alias.evaluated_name)  # from apex import amp: amp is apex.amp
    return out


def reference_matcher(prefixes: tuple[str, ...], message: str) -> Matcher:
    """Report imports from ``prefixes`` and names that resolve to one of them."""
    lasts = tuple(p.rpartition(".")[2] for p in prefixes)

    def match(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            ctx.import_heads.update(_bound_names(node, prefixes))
            for module in _imported_names(node):
                if any(module == p or module.startswith(p + ".") for p in prefixes):
                    return Hit(None, message.format(name=module))
            return None
        text = dotted(node)
        if ctx.in_import or text is None:
            return None
        # A cheap look first: the text names the API, or its head is a name an import of it bound.
        head = text.split(".")[0]
        if not (head in ctx.import_heads or any(last in text for last in lasts)):
            return None
        if ctx.binding(node) != "import":
            return None  # a name counts only where an import bound it
        qual = ctx.qualname(node)
        if qual is not None and qual in prefixes:
            return Hit(None, message.format(name=qual))
        return None

    return match


_cpp_extension = reference_matcher(
    ("torch.utils.cpp_extension",),
    "{name}: a CUDA/C++ extension must be rebuilt for Ascend (torch_npu's op-plugin)",
)


def match_cu_source(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM101."""
    if isinstance(node, cst.SimpleString):
        value = string_value(node)
        if value is not None and value.endswith((".cu", ".cuh")) and "\n" not in value:
            return Hit(None, f"CUDA source file {value!r}: a CUDA kernel has to be ported to Ascend C by hand")
        return None
    return _cpp_extension(node, ctx)


def match_float64(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM107."""
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "double" and not node.args:
            return Hit(None, ".double() makes float64 tensors, which Ascend NPUs do not compute in")
        return None
    if ctx.in_import or not (dotted(node) or "").endswith(("float64", "double")) or ctx.binding(node) != "import":
        return None
    qual = ctx.qualname(node)
    if qual in ("torch.float64", "torch.double"):
        return Hit(None, f"{qual} is not supported on Ascend NPUs")
    return None


def match_device_comparison(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM109."""
    assert isinstance(node, cst.Comparison)
    operands = [node.left, *(c.comparator for c in node.comparisons)]
    for operand in operands:
        value = string_value(operand)
        if value is not None and (is_device_literal(value, "cuda") or value == "nccl"):
            return Hit(None, f"comparison with {value!r} is False on NPUs and CPUs")
    return None


def match_leftover_literal(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM113 (judged on the ported tree)."""
    value = string_value(node)
    if value is None or not (is_device_literal(value, "cuda") or value == "nccl"):
        return None
    if isinstance(ctx.parent, (cst.Comparison, cst.ComparisonTarget)):
        return None  # NM109 reports it
    if isinstance(ctx.parent, cst.DictElement) and ctx.parent.key is ctx.node:
        return None  # a key names what is mapped (map_location={"cuda:0": ...}), not the device used
    return Hit(None, f"string {value!r} left as written: if it names the device or backend, it is not portable")
