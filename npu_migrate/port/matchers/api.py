"""Matchers for ``torch.cuda.*`` calls (and ``torch.npu.*``), read from :mod:`npu_migrate.cuda_api`.

Usage::

    from npu_migrate.port.matchers.api import match_cuda_api

A call whose API the table marks ``mapped`` is rewritten to the table's operation with its
keyword arguments renamed to the target's parameters; anything else is reported with the
table's advice. Availability checks that only guard the script (``assert
torch.cuda.is_available()``, ``if not torch.cuda.is_available(): sys.exit(...)`` and the
``else: sys.exit`` form) become "the selected family is available", which is also true on the
CPU, so the ported script runs wherever it is started.
"""

from __future__ import annotations

from typing import Any, Optional

import libcst as cst

from npu_migrate.cuda_api import CUDA_API, classify, normalize
from npu_migrate.port.context import Context, Hit
from npu_migrate.port.matchers.common import dotted, to_keywords
from npu_migrate.port.targets import TARGETS

_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit", "SystemExit"})
# Operations whose npu_migrate function takes no arguments although torch.cuda's takes an
# optional device: the argument is dropped only when it is the current device anyway.
_NO_ARGS = frozenset({"accelerator_available", "device_count", "current_device_index", "synchronize", "empty_cache",
                      "is_bf16_supported"})


def _family_of(qual: str) -> str:
    return "cuda" if qual.startswith("torch.cuda.") else "npu"


def _exits(block: cst.BaseSuite) -> bool:
    """Whether a block ends by leaving the script (raise, sys.exit(), exit(), quit(), os._exit())."""
    if not isinstance(block, cst.IndentedBlock) or not block.body:
        return isinstance(block, cst.SimpleStatementSuite) and bool(block.body) and _small_exits(block.body[-1])
    last = block.body[-1]
    return isinstance(last, cst.SimpleStatementLine) and bool(last.body) and _small_exits(last.body[-1])


def _small_exits(stmt: cst.BaseSmallStatement) -> bool:
    if isinstance(stmt, cst.Raise):
        return True
    return isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call) and dotted(stmt.value.func) in _EXITS


def is_guard(ctx: Context) -> bool:
    """Whether the matched availability call only guards the script (assert, exit or raise)."""
    node, parent, grand = ctx.node, ctx.ancestor(1), ctx.ancestor(2)
    if isinstance(parent, cst.Assert) and parent.test is node:
        return True
    if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not) \
            and isinstance(grand, cst.If) and grand.test is parent:
        return _exits(grand.body)
    if isinstance(parent, cst.If) and parent.test is node and isinstance(parent.orelse, cst.Else):
        return _exits(parent.orelse.body)
    return False


def _accepts_args(op: str, style: str) -> bool:
    template = TARGETS[op].template(style) or ""
    return "ARGS" in template or "ARG0" in template


def _candidate(func: cst.BaseExpression, last_names: frozenset[str]) -> bool:
    """A cheap look before any scope question: the callee's text names a device API."""
    text = dotted(func)
    return text is not None and (_names_device_module(text) or text.rpartition(".")[2] in last_names)


def _names_device_module(text: str) -> bool:
    """``torch.cuda.x``, ``tc.cuda``, ``torch_npu.npu.x``: a part of the dotted name is the module."""
    parts = text.split(".")
    return "cuda" in parts or "npu" in parts or parts[0] == "torch_npu"


_MAPPED_LAST = frozenset(api.name.rpartition(".")[2] for api in CUDA_API.values() if api.kind == "mapped")


def _mapped_call(node: cst.CSTNode, ctx: Context, families: tuple[str, ...]) -> Optional[tuple[str, Any]]:
    """The qualified name and table row of the imported, mapped CUDA/NPU API ``node`` calls, or None."""
    assert isinstance(node, cst.Call)
    if not _candidate(node.func, _MAPPED_LAST):
        return None
    qual = ctx.qualname(node.func)
    if qual is None or ctx.binding(node.func) != "import" or normalize(qual) is None:
        return None
    if _family_of(qual) not in families:
        return None
    api = classify(qual)
    if api is None or api.kind != "mapped" or api.op is None:
        return None
    return qual, api


def match_api(node: cst.CSTNode, ctx: Context, families: tuple[str, ...] = ("cuda",)) -> Optional[Hit]:
    """NM004 (``torch.cuda.*``) and NM021 (``torch.npu.*``, ``torch_npu.npu.*``) calls."""
    found = _mapped_call(node, ctx, families)
    if found is None or found[1].name.startswith("amp."):
        return None
    qual, api = found
    op = api.op
    args = list(node.args)
    message = api.note
    if op == "accelerator_available" and not args and is_guard(ctx):
        op = "selected_available"
        message = "a guard: the ported script runs on whichever device family is selected, the CPU included"
    if args and not _accepts_args(op, ctx.style):
        if op in _NO_ARGS and op == "synchronize" and len(args) == 1:
            message = "the device argument of synchronize() was dropped: nm.synchronize() waits for the current device"
            args = []
        else:
            return Hit(None, f"{qual}() with arguments has no device-neutral equivalent here",
                       f"call {TARGETS[op].npu_migrate} without arguments on the current device")
    # Keyword names of torch.cuda's signature that the target spells differently are renamed by emit();
    # a keyword the target does not know at all is refused here rather than written as a TypeError.
    for a in args:
        if a.keyword is not None and api.params and a.keyword.value not in api.params:
            return Hit(None, f"{qual}() has no parameter {a.keyword.value!r}", "fix the call first")
    ctx.count_rewrite(node.func)
    return Hit(ctx.emit(op, args, keep_call=node if len(args) == len(node.args) else None), message)


def match_cuda_api(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM004."""
    return match_api(node, ctx, ("cuda",))


def match_amp(node: cst.CSTNode, ctx: Context, families: tuple[str, ...] = ("cuda",)) -> Optional[Hit]:
    """NM005: ``torch.cuda.amp.autocast(...)`` and ``torch.cuda.amp.GradScaler(...)``."""
    found = _mapped_call(node, ctx, families)
    if found is None or not found[1].name.startswith("amp."):
        return None
    qual, api = found
    args = to_keywords(node, api.params)
    if args is None:
        return Hit(None, f"{qual}(*args) cannot be rewritten", "pass the arguments by keyword")
    ctx.count_rewrite(node.func)
    return Hit(ctx.emit(api.op, args))


def match_unmapped(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    """NM112: ``torch.cuda`` (and ``torch.npu``) APIs the table does not map, with its advice."""
    if ctx.in_import:
        return None
    text = dotted(node)
    if text is None or not _names_device_module(text):
        return None
    qual = ctx.qualname(node)
    if qual is None or ctx.binding(node) != "import":
        return None
    full = normalize(qual)
    if full is None or full == "torch.cuda.":
        return None
    if isinstance(ctx.parent, cst.Attribute) and ctx.parent.value is ctx.node:
        parent_qual = ctx.qualname(ctx.parent)
        if parent_qual is not None and normalize(parent_qual) is not None:
            return None  # report the longest name once: torch.cuda.amp.foo, not torch.cuda.amp too
    api = classify(qual)
    if api is not None and (api.kind in ("mapped", "ignored")):
        return None
    if full.startswith(("torch.cuda.nvtx", "torch.cuda.graph", "torch.cuda.CUDAGraph",
                        "torch.cuda.make_graphed_callables")) and qual.startswith("torch.cuda."):
        return None  # NM105 / NM106 report these
    if api is None:
        return Hit(None, f"{qual} has no row in npu_migrate.cuda_api")
    if api.kind == "noop":
        return Hit(None, f"{qual} does nothing useful off CUDA ({api.note})",
                   "remove it, or guard it with nm.device_type() == \"cuda\"")
    return Hit(None, f"{qual} has no device-neutral equivalent: {api.note}")
