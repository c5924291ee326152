"""Matchers for CUDA-only libraries: flash_attn (NM030), xformers (NM031), apex (NM032) imports.

Usage::

    from npu_migrate.port.matchers.libs import match_flash_attn

An import of a module that :data:`npu_migrate.libs.table.MODULES` serves is rewritten to the npu_migrate
module with the same API, so every call keeps its arguments and meaning::

    from flash_attn import flash_attn_func          ->  from npu_migrate.libs.flash_attn import flash_attn_func
    import xformers.ops as xops                     ->  import npu_migrate.libs.xformers as xops
    from apex import amp                            ->  from npu_migrate.libs import apex_amp as amp

Imports of parts npu_migrate does not provide (``flash_attn.bert_padding``, ``apex.parallel``), of names
it does not provide, or that bind the package itself (``import xformers.ops``, used as
``xformers.ops.f(...)``) are reported instead. ``--style torch`` has no spelling for these (the helper
lives in npu_migrate): reported there too.
"""

from __future__ import annotations

import importlib
from typing import Optional

import libcst as cst

from npu_migrate.libs.table import MODULES
from npu_migrate.port.context import Context, Hit, NoEquivalent, dotted


def _exports(impl: str) -> frozenset[str]:
    return frozenset(getattr(importlib.import_module(impl), "__all__", ()))


def _module_expr(name: str) -> cst.BaseExpression:
    return cst.parse_expression(name)


def _match(node: cst.CSTNode, ctx: Context, root: str, what: str, report: bool = True) -> Optional[Hit]:
    """Rewrite an import of ``root`` that npu_migrate serves; report the others (``report=False``: leave
    them to another rule, as NM102 reports apex)."""
    hit = _rewrite(node, ctx, root, what)
    return hit if hit is None or hit.replacement is not None or report else None


def _rewrite(node: cst.CSTNode, ctx: Context, root: str, what: str) -> Optional[Hit]:
    if isinstance(node, cst.Import):
        names = [dotted(a.name) or "" for a in node.names]
        if not any(n == root or n.startswith(root + ".") for n in names):
            return None
        if len(node.names) != 1:
            return Hit(None, f"{what}: split this import into one line per module to have it ported")
        alias = node.names[0]
        module = names[0]
        impl = MODULES.get(module)
        bound_whole = alias.asname is None and "." in module  # `import xformers.ops` binds `xformers`
        if not impl or bound_whole:
            return Hit(None, f"{what}: `import {module}` is not ported (npu_migrate serves "
                       f"{', '.join(m for m in MODULES if m.startswith(root) and MODULES[m])})",
                       f"import the module with an alias (`import {module} as x`) or from-import its names")
        if ctx.style == "torch":
            raise NoEquivalent(f"{module} has no torch-only spelling; npu_migrate.libs provides it")
        asname = alias.asname.name if alias.asname is not None else cst.Name(module)
        return Hit(cst.Import(names=[cst.ImportAlias(name=_module_expr(impl), asname=cst.AsName(name=asname))]),
                   f"{what}: {module} -> {impl} (same API, SDPA / the NPU's kernels underneath)")
    if not isinstance(node, cst.ImportFrom) or node.relative or node.module is None:
        return None
    module = dotted(node.module) or ""
    if module != root and not module.startswith(root + "."):
        return None
    if isinstance(node.names, cst.ImportStar):
        return Hit(None, f"{what}: `from {module} import *` is not ported", "import the names you use")
    wanted = [a.name.value for a in node.names if isinstance(a.name, cst.Name)]
    impl = MODULES.get(module, "")
    submodules = [f"{module}.{n}" for n in wanted if MODULES.get(f"{module}.{n}")]
    if submodules and len(submodules) == len(wanted) == 1:  # from apex import amp
        target = MODULES[submodules[0]]
        parent, _, leaf = target.rpartition(".")
        if ctx.style == "torch":
            raise NoEquivalent(f"{submodules[0]} has no torch-only spelling; npu_migrate.libs provides it")
        alias = node.names[0]
        asname = alias.asname.name if alias.asname is not None else cst.Name(wanted[0])
        return Hit(node.with_changes(module=_module_expr(parent),
                                     names=[cst.ImportAlias(name=cst.Name(leaf), asname=cst.AsName(name=asname))]),
                   f"{what}: {submodules[0]} -> {target}")
    missing = [n for n in wanted if not impl or n not in _exports(impl)]
    if missing:
        return Hit(None, f"{what}: {', '.join(missing)} from {module} "
                   f"{'is' if len(missing) == 1 else 'are'} not provided by npu_migrate",
                   "write that part with torch ops (see docs/cuda-libraries.md for what is provided)")
    if ctx.style == "torch":
        raise NoEquivalent(f"{module} has no torch-only spelling; npu_migrate.libs provides it")
    return Hit(node.with_changes(module=_module_expr(impl)), f"{what}: {module} -> {impl} (same API)")


def match_flash_attn(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM030: flash_attn imports."""
    return _match(node, ctx, "flash_attn", "flash-attn is CUDA-only")


def match_xformers(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM031: xformers imports."""
    return _match(node, ctx, "xformers", "xformers is CUDA-only")


def match_apex(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM032: apex optimizer, normalization and amp imports."""
    return _match(node, ctx, "apex", "NVIDIA apex is CUDA-only", report=False)  # NM102 reports the rest
