"""The libcst transformer that applies the rule table of :mod:`npu_migrate.port.rules`.

Usage::

    import libcst as cst
    from npu_migrate.port.rules import RULES
    from npu_migrate.port.transformer import transform

    module, changes, findings, changed = transform(cst.parse_module(source), RULES, style="npu_migrate")

The transformer knows no API names. Names are resolved through :class:`Context` with libcst's
scope analysis (``ScopeProvider``, computed on first use), it calls each rule registered for a node's type once the node's
children are ported, records what each rule changed or found with the original line and column,
and at the end inserts the helper functions the replacements call and adds and drops imports
(:mod:`npu_migrate.port.finish`); positions are measured only for what was recorded
(:mod:`npu_migrate.port.positions`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from npu_migrate.port.context import Context, Hit, NoEquivalent, Rule, plain_imports
from npu_migrate.port.finish import choose_alias, finish_imports, insert_helpers
from npu_migrate.port.positions import locator
from npu_migrate.port.targets import HELPERS, NM_ALIAS


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
        alias = choose_alias(scopes)
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
        locate = locator(module, wrapper, source)

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
        new = insert_helpers(new, ctx)
        new = finish_imports(module, new, ctx)
    return new, changes, findings, transformer.changed
