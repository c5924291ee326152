"""After the rules: the name ``npu_migrate`` is bound as, the helpers inserted, imports added and dropped.

Usage::

    alias = choose_alias(scopes)             # "nm", unless the file uses that name for something else
    module = insert_helpers(module, ctx)     # the helper functions the replacements call
    module = finish_imports(original, module, ctx)

Imports are added with libcst's ``AddImportsVisitor`` and dropped with ``RemoveImportsVisitor``
(which respects ``__all__``, string annotations and local imports): only imports of ``torch.cuda``,
``torch.npu`` and ``torch_npu`` that the port made unused go. Called by
:func:`npu_migrate.port.transformer.transform`.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper

from npu_migrate.port.context import Context, dotted
from npu_migrate.port.targets import HELPERS, NM_ALIAS, NM_MODULE, helper_source


# Import-bound names whose import may go once every use is rewritten: torch.cuda's and torch_npu's.
_DROPPABLE = ("torch.cuda", "torch.npu", "torch_npu")


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.new) if updated_node.value == self.old else updated_node


def _taken(scopes: Iterable[Any], name: str) -> bool:
    """Whether any scope binds or reads ``name`` other than as ``import npu_migrate as <name>``."""
    for scope in scopes:
        for assignment in scope.assignments[name]:
            node = getattr(assignment, "node", None)
            if not (isinstance(node, (cst.Import, cst.ImportFrom)) and _binds_npu_migrate(node, name)):
                return True
        if scope.accesses[name] and not scope.assignments[name] and scope.parent is scope:
            return True  # read at module level but bound nowhere here (a builtin or a star import)
    return False


def _binds_npu_migrate(node: cst.CSTNode, name: str) -> bool:
    if not isinstance(node, cst.Import):
        return False
    for alias in node.names:
        if dotted(alias.name) == NM_MODULE and alias.asname is not None and \
                isinstance(alias.asname.name, cst.Name) and alias.asname.name.value == name:
            return True
        if dotted(alias.name) == NM_MODULE and alias.asname is None and name == NM_MODULE:
            return True
    return False


def choose_alias(scopes: Sequence[Any]) -> str:
    """``nm`` unless the file uses that name for something else; then the first free of a few."""
    for candidate in (NM_ALIAS, "npu_migrate", "nm_", "_nm"):
        if not _taken(scopes, candidate):
            return candidate
    i = 2
    while _taken(scopes, f"nm{i}"):
        i += 1
    return f"nm{i}"


def insert_helpers(module: cst.Module, ctx: Context) -> cst.Module:
    """Insert the helpers the replacements call, after the first run of imports."""
    defined = {s.name.value for s in module.body if isinstance(s, cst.FunctionDef)}
    wanted = [h for h in HELPERS if h in ctx.helpers and h not in defined]
    if not wanted:
        return module
    two_blank = [cst.EmptyLine(), cst.EmptyLine()]
    stmts = []
    for name in wanted:
        stmt = cst.parse_statement(helper_source(name, ctx.style))
        if ctx.alias != NM_ALIAS:
            stmt = stmt.visit(_Rename(NM_ALIAS, ctx.alias))
        stmts.append(stmt.with_changes(leading_lines=two_blank))  # type: ignore[union-attr]
        ctx.needs.add("torch")
        if ctx.style == "npu_migrate":
            ctx.needs.add(NM_ALIAS)
    body = list(module.body)
    at = _insert_at(body)
    if at < len(body):
        nxt = body[at]
        lines = list(nxt.leading_lines)
        blanks = 0
        for line in lines:
            if line.comment is not None:
                break
            blanks += 1
        if blanks < 2:
            body[at] = nxt.with_changes(leading_lines=[cst.EmptyLine()] * (2 - blanks) + lines)
    body[at:at] = stmts
    return module.with_changes(body=body)


def _insert_at(body: Sequence[cst.BaseStatement]) -> int:
    """Index after the file's first run of imports (after a docstring if there are none)."""
    at = 0
    last_import = None
    for i, stmt in enumerate(body):
        if i == 0 and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
                and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value,
                                                                    (cst.SimpleString, cst.ConcatenatedString)):
            at = 1
            continue
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            last_import = i
            continue
        break
    return at if last_import is None else last_import + 1


class _ImportsOf(cst.CSTVisitor):
    """Imports anywhere in the module that bind one of ``heads`` from a droppable module."""

    def __init__(self, heads: set[str]) -> None:
        super().__init__()
        self.heads = heads
        self.found: list[cst.CSTNode] = []

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            full = dotted(alias.name) or ""
            local = alias.evaluated_alias or full.split(".")[0]
            if local in self.heads and full.startswith(_DROPPABLE):
                self.found.append(node)
                break
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return False
        module = dotted(node.module) or ""
        if module.startswith(_DROPPABLE) and any((a.evaluated_alias or a.evaluated_name) in self.heads
                                                for a in node.names):
            self.found.append(node)
        return False


def finish_imports(original: cst.Module, module: cst.Module, ctx: Context) -> cst.Module:
    """Add the imports the new code needs and drop those it made unused, with libcst's codemod visitors."""
    # Imported here: libcst.codemod pulls in libcst.matchers, the largest part of libcst's import
    # time, which `port --list-rules` and files with nothing to port never need.
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor, ImportItem, RemoveImportsVisitor

    removals: list[tuple[str, Optional[str], Optional[str]]] = []
    nodes = list(ctx.dropped_imports)
    if ctx.rewritten_heads:
        finder = _ImportsOf(ctx.rewritten_heads)
        original.visit(finder)
        nodes.extend(finder.found)
    scratch = CodemodContext()
    for node in nodes:
        RemoveImportsVisitor.remove_unused_import_by_node(scratch, node)
    removals = list(scratch.scratch.get(RemoveImportsVisitor.CONTEXT_KEY, ()))
    if removals:
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        module = wrapper.visit(RemoveImportsVisitor(CodemodContext(wrapper=wrapper), removals))
    items = []
    if "torch" in ctx.needs:
        items.append(ImportItem("torch", None, None))
    if "os" in ctx.needs:
        items.append(ImportItem("os", None, None))
    if NM_ALIAS in ctx.needs:
        items.append(ImportItem(NM_MODULE, None, None if ctx.alias == NM_MODULE else ctx.alias))
    if items:
        module = module.visit(AddImportsVisitor(CodemodContext(), items))
    return module
