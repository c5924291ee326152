"""The libcst transformer that applies the rule table of :mod:`npu_migrate.port.rules`.

Usage::

    import libcst as cst
    from npu_migrate.port.rules import RULES
    from npu_migrate.port.transformer import transform

    module, changes, findings, changed = transform(cst.parse_module(source), RULES, style="npu_migrate")

The transformer knows no API names. Names are resolved through :class:`Context` with libcst's
scope analysis (``ScopeProvider``, computed on first use), it calls each rule registered for a node's type once the node's
children are ported, records what each rule changed or found with the original line and column,
and at the end inserts the helper functions the replacements call, adds the imports they need
with libcst's ``AddImportsVisitor`` and drops the imports they made unused with
``RemoveImportsVisitor`` (which respects ``__all__``, string annotations and local imports).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider

from npu_migrate.port.context import Context, Hit, NoEquivalent, Rule, dotted, plain_imports
from npu_migrate.port.targets import HELPERS, NM_ALIAS, NM_MODULE, helper_source


@dataclass(frozen=True)
class Change:
    """One rewrite: the rule, where it was in the input, and the code before and after."""

    code: str
    line: int
    col: int
    before: str
    after: str
    message: str = ""
    cell: Optional[int] = None  # for notebooks: the code cell's index


@dataclass(frozen=True)
class Finding:
    """One site that needs a human: the rule, where, why, and the suggested fix."""

    code: str
    line: int
    col: int
    message: str
    fix: str
    cell: Optional[int] = None  # for notebooks: the code cell's index


def _snippet(node: cst.CSTNode, limit: int = 100) -> str:
    text = " ".join(cst.Module(body=[]).code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_reference(node: cst.Name, parent: Optional[cst.CSTNode]) -> bool:
    """Whether a Name reads a variable (not an attribute's name, a keyword, a definition...)."""
    if isinstance(parent, cst.Attribute):
        return parent.attr is not node
    if isinstance(parent, cst.Arg):
        return parent.keyword is not node
    if isinstance(parent, (cst.Param, cst.FunctionDef, cst.ClassDef, cst.ImportAlias, cst.AsName)):
        return False
    return True


# Import-bound names whose import may go once every use is rewritten: torch.cuda's and torch_npu's.
_DROPPABLE = ("torch.cuda", "torch.npu", "torch_npu")


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.new) if updated_node.value == self.old else updated_node


class PortTransformer(cst.CSTTransformer):
    """Apply ``rules`` to a module; :func:`transform` adds the positions of what it recorded."""

    def __init__(self, rules: Iterable[Rule], ctx: Context, deferred: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.deferred = deferred
        self.ctx = ctx
        self.by_type: dict[type, list[Rule]] = {}
        for rule in rules:
            for node_type in rule.nodes:
                self.by_type.setdefault(node_type, []).append(rule)
        self.changes: list[tuple] = []  # (Change, original node, fields...) until positions are known
        self.findings: list[tuple] = []
        self.changed = False
        self._deferred: list[tuple[cst.CSTNode, tuple]] = []
        self._stack: list[cst.CSTNode] = ctx.stack

    def _top(self) -> Optional[cst.CSTNode]:
        """The top-level statement the matched node is in (positions are computed per statement)."""
        return self._stack[1] if len(self._stack) > 1 else None

    # Attribute-level hooks are not used; skipping their dispatch saves a getattr per field.
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            self.ctx.in_import += 1
        self._stack.append(node)
        # Helpers this tool inserted are device-neutral already: a second port leaves them alone.
        return not (isinstance(node, cst.FunctionDef) and node.name.value in HELPERS)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        self._stack.pop()
        parent = self._stack[-1] if self._stack else None
        node_type = type(original_node)
        ctx = self.ctx
        if node_type is cst.Import or node_type is cst.ImportFrom:
            ctx.in_import -= 1
        elif node_type is cst.Name or node_type is cst.Attribute:
            if node_type is cst.Name and not _is_reference(original_node, parent):  # type: ignore[arg-type]
                return updated_node
            ctx.note_origin(updated_node, original_node)
        elif node_type is cst.Module:
            return updated_node
        rules = self.by_type.get(node_type)
        if not rules:
            return updated_node
        ctx.parent = parent
        ctx.node = original_node
        node = updated_node
        for rule in rules:
            try:
                hit: Optional[Hit] = rule.match(node, ctx)
            except NoEquivalent as exc:
                hit = Hit(None, f"not rewritten in --style {ctx.style}: {exc}",
                          "use --style npu_migrate, or port this site by hand")
            if hit is None:
                continue
            # Positions are looked up at the end, and only for files where something was found:
            # computing them costs about as much as parsing.
            if hit.replacement is None:
                finding = (Finding, original_node, self._top(), rule.code, hit.message or rule.summary,
                           hit.fix or rule.fix)
                if rule.code in self.deferred:
                    self._deferred.append((node, finding))
                else:
                    self.findings.append(finding)
                continue
            before = original_node if node is updated_node else node
            after = hit.replacement if hit.replacement is not node else cst.Module(body=[])
            self.changes.append((Change, original_node, self._top(), rule.code, _snippet(before), _snippet(after),
                                 hit.message))
            self.changed = True
            node = hit.replacement
            if type(node) is not node_type:
                break
        return node


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


def _own_methods(module: cst.Module, names: Sequence[str]) -> set[str]:
    """Which of ``names`` a class in the module defines as a method (``def cuda(self)``)."""
    found: set[str] = set()

    class _Classes(cst.CSTVisitor):
        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            for stmt in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value in names:
                    found.add(stmt.name.value)

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            return False  # no class is defined inside a simple statement

    module.visit(_Classes())
    return found


def _value(value: Any) -> Any:
    """A metadata value, computed where libcst left it lazy."""
    return value() if callable(value) and not isinstance(value, type) and type(value).__name__ == "LazyValue" else value


def _choose_alias(scopes: Sequence[Any]) -> str:
    """``nm`` unless the file uses that name for something else; then the first free of a few."""
    for candidate in (NM_ALIAS, "npu_migrate", "nm_", "_nm"):
        if not _taken(scopes, candidate):
            return candidate
    i = 2
    while _taken(scopes, f"nm{i}"):
        i += 1
    return f"nm{i}"


def _insert_helpers(module: cst.Module, ctx: Context) -> cst.Module:
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


def _finish_imports(original: cst.Module, module: cst.Module, ctx: Context) -> cst.Module:
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


def _statement_lines(module: cst.Module, source: str) -> Optional[list[int]]:
    """The first line of each top-level statement of ``module``, from Python's own (fast) parser."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    body, lines, i = tree.body, [], 0
    for stmt in module.body:
        if i >= len(body):
            return None
        node = body[i]
        decorators = getattr(node, "decorator_list", None)
        lines.append(decorators[0].lineno if decorators else node.lineno)
        i += len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
    return lines if i == len(body) else None


def _locator(module: cst.Module, wrapper: MetadataWrapper, source: Optional[str]) -> Any:
    """``(node, top-level statement) -> (line, column)`` in the input.

    libcst's PositionProvider generates the code of the whole module to count positions, which
    costs about as much as parsing it. Only the statements that hold a change or finding are
    measured here, each on its own, and placed with the statement lines of Python's ``ast``; the
    whole-module provider is the fallback.
    """
    starts = _statement_lines(module, source) if source is not None else None
    index = {id(stmt): i for i, stmt in enumerate(module.body)}
    cache: dict[int, tuple[Any, int]] = {}
    whole: list[Any] = []

    def fallback(node: cst.CSTNode) -> tuple[int, int]:
        if not whole:
            whole.append(wrapper.resolve(PositionProvider))
        start = whole[0][node].start
        return start.line, start.column + 1

    def locate(node: cst.CSTNode, top: Optional[cst.CSTNode]) -> tuple[int, int]:
        if starts is None or top is None or id(top) not in index:
            return fallback(node)
        entry = cache.get(id(top))
        if entry is None:
            positions = MetadataWrapper(cst.Module(body=[top]), unsafe_skip_copy=True).resolve(PositionProvider)
            decorators = getattr(top, "decorators", None)
            first = decorators[0] if decorators else top  # ast's line of a decorated definition
            entry = cache[id(top)] = (positions, starts[index[id(top)]] - positions[first].start.line)
        positions, offset = entry
        start = positions[node].start
        return start.line + offset, start.column + 1

    return locate


def _deferred_findings(transformer: PortTransformer, module: cst.Module) -> None:
    if not transformer._deferred:
        return
    present: set[int] = set()

    class _Collect(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            present.add(id(node))

    module.visit(_Collect())
    transformer.findings.extend(f for node, f in transformer._deferred if id(node) in present)


def transform(
    module: cst.Module, rules: Iterable[Rule], style: str = "npu_migrate", report_only: bool = False,
    deferred: frozenset[str] = frozenset(), source: Optional[str] = None,
) -> tuple[cst.Module, list[Change], list[Finding], bool]:
    """Port ``module`` with ``rules``.

    Args:
        module: the parsed source.
        rules: the rules to apply.
        style: ``"npu_migrate"`` or ``"torch"``.
        report_only: report what would be rewritten instead of rewriting it (``npu-migrate check``).
        deferred: codes of report-only rules judged on the ported tree (a leftover literal).
        source: the module's text, if at hand: lets text checks skip work (is ``nm`` mentioned at
            all? does a class define ``cuda()``?); the tree decides whenever they pass.

    Returns:
        The new module, the changes, the findings (sorted by position) and whether anything changed.
    """
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    alias = NM_ALIAS
    if style == "npu_migrate" and (source is None or re.search(rf"\b{NM_ALIAS}\b", source)):
        # The text says `nm` may be taken: ask the scopes who binds or reads it.
        scopes = list({id(s): s for s in map(_value, wrapper.resolve(ScopeProvider).values()) if s is not None}.values())
        alias = _choose_alias(scopes)
    ctx = Context(style, alias)
    ctx.use_scopes(lambda: wrapper.resolve(ScopeProvider))
    if source is not None:
        ctx.plain_import_heads = plain_imports(source)
    if source is None or re.search(r"def\s+(cuda|npu)\s*\(", source):
        ctx.own_device_methods = frozenset(_own_methods(module, ("cuda", "npu")))
    transformer = PortTransformer(rules, ctx, deferred)
    new = module.visit(transformer)
    _deferred_findings(transformer, new)
    changes: list[Change] = []
    findings: list[Finding] = []
    if transformer.changes or transformer.findings:
        locate = _locator(module, wrapper, source)

        def place(record: tuple) -> Any:
            cls, node, top, code, *rest = record
            line, col = locate(node, top)
            return cls(code, line, col, *rest)

        changes = sorted(map(place, transformer.changes), key=lambda c: (c.line, c.col, c.code))
        findings = list(map(place, transformer.findings))
    if report_only:
        # The rewrites were made (so leftovers are judged as after a port) but are reported instead.
        findings = findings + [
            Finding(c.code, c.line, c.col, f"{c.before} -> {c.after}", "run npu-migrate port") for c in changes
        ]
        return module, [], sorted(findings, key=lambda f: (f.line, f.col, f.code)), False
    findings = sorted(findings, key=lambda f: (f.line, f.col, f.code))
    if transformer.changed:
        new = _insert_helpers(new, ctx)
        new = _finish_imports(module, new, ctx)
    return new, changes, findings, transformer.changed
