"""The libcst transformer that applies the rule table of :mod:`npu_migrate.port.rules`.

Usage::

    import libcst as cst
    from npu_migrate.port.rules import RULES
    from npu_migrate.port.transformer import transform

    module, changes, findings = transform(cst.parse_module(source), RULES, style="npu_migrate")

The transformer knows no API names: it resolves dotted names through the module's imports,
calls every rule registered for a node's type once the node's children are ported, records what
each rule changed or found with the original line and column, and at the end adds the imports and
(``--style torch``) the helper functions the replacements use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from npu_migrate.port import rules as _rules
from npu_migrate.port.rules import (
    DEFERRED, NM_ALIAS, NM_IMPORT, TARGETS, TORCH_HELPERS, TORCH_IMPORT, Hit, Rule, _dotted,
)


@dataclass(frozen=True)
class Change:
    """One rewrite: the rule, where it was in the input, and the code before and after."""

    code: str
    line: int
    col: int
    before: str
    after: str
    message: str = ""


@dataclass(frozen=True)
class Finding:
    """One site that needs a human: the rule, where, why, and the suggested fix."""

    code: str
    line: int
    col: int
    message: str
    fix: str


class NoEquivalent(Exception):
    """The chosen output style has no spelling for an operation (see ``Target.torch_missing``)."""


def _snippet(node: cst.CSTNode, limit: int = 100) -> str:
    text = " ".join(cst.Module(body=[]).code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."



class _Fill(cst.CSTTransformer):
    """Put a call's arguments into a template: ``ARGS`` takes them all, ``ARG0`` the first value."""

    def __init__(self, args: Sequence[cst.Arg]) -> None:
        super().__init__()
        self.args = list(args)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        out: list[cst.Arg] = []
        spliced = False
        for arg in updated_node.args:
            if arg.keyword is None and isinstance(arg.value, cst.Name) and arg.value.value == "ARGS":  # or **ARGS
                out.extend(self.args)
                spliced = True
            else:
                out.append(arg)
        if not spliced:
            return updated_node
        if out and not self.args:
            out[-1] = out[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(args=out)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if updated_node.value == "ARG0" and self.args:
            return self.args[0].value
        return updated_node


class Context:
    """What a matcher may ask: names resolved through imports, the parent node, and ``emit``."""

    def __init__(self, style: str) -> None:
        self.style = style
        self.aliases: dict[str, str] = {}
        self.parent: Optional[cst.CSTNode] = None  # the original parent of the node being matched
        self.node: Optional[cst.CSTNode] = None  # the original node being matched
        self.in_import = 0
        self.needs_nm = False
        self.needs_torch = False
        self.helpers: list[str] = []
        self._emitted: dict[int, tuple[str, cst.CSTNode]] = {}
        self.alias_uses: dict[str, int] = {}
        self.alias_rewrites: dict[str, int] = {}
        self.import_cleanups: dict[str, dict[str, Any]] = {}

    # -- names

    def add_import(self, node: cst.CSTNode) -> None:
        """Record the names an ``import`` or ``from ... import`` statement binds."""
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _dotted(alias.name)  # type: ignore[arg-type]
                if full is None:
                    continue
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.aliases[alias.asname.name.value] = full
                else:
                    head = full.split(".")[0]
                    self.aliases[head] = head
        elif isinstance(node, cst.ImportFrom):
            if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
                return
            module = _dotted(node.module)
            if module is None:
                return
            for alias in node.names:
                if not isinstance(alias.name, cst.Name):
                    continue
                local = alias.asname.name.value if alias.asname is not None and isinstance(
                    alias.asname.name, cst.Name) else alias.name.value
                self.aliases[local] = f"{module}.{alias.name.value}"

    def imported_names(self, node: cst.CSTNode) -> list[str]:
        """The full names an import statement brings in (``a.b`` for ``import a.b``; ``a.b.c`` for
        ``from a.b import c``)."""
        if isinstance(node, cst.Import):
            return [n for a in node.names if (n := _dotted(a.name)) is not None]  # type: ignore[arg-type]
        if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
            module = _dotted(node.module)
            if module is None:
                return []
            if isinstance(node.names, cst.ImportStar):
                return [module]
            return [f"{module}.{a.name.value}" for a in node.names if isinstance(a.name, cst.Name)]
        return []

    def qualname(self, node: cst.CSTNode) -> Optional[str]:
        """The dotted name ``node`` refers to, through import aliases (``nn.X`` -> ``torch.nn.X``)."""
        name = _dotted(node)  # type: ignore[arg-type]
        if name is None:
            return None
        head, dot, rest = name.partition(".")
        return self.aliases.get(head, head) + dot + rest

    def parent_qualname_startswith(self, prefix: str) -> bool:
        """Whether the parent is a longer dotted name that also starts with ``prefix``."""
        parent = self.parent
        if not isinstance(parent, cst.Attribute):
            return False
        qual = self.qualname(parent)
        return qual is not None and qual.startswith(prefix)

    def count_alias_rewrite(self, func: cst.BaseExpression) -> None:
        """Note that a call through an imported bare name was rewritten (see ``drop_rewritten_imports``)."""
        if isinstance(func, cst.Name) and func.value in self.aliases:
            self.alias_rewrites[func.value] = self.alias_rewrites.get(func.value, 0) + 1

    def drop_rewritten_imports(self, node: cst.ImportFrom, table: dict[str, Any]) -> Optional[Hit]:
        """Ask for ``from X import name`` to be dropped once every use of ``name`` was rewritten."""
        self.import_cleanups[id(table)] = table
        return None

    # -- output

    def emit(self, op: str, args: Sequence[cst.Arg] = (), keep_call: Optional[cst.Call] = None) -> cst.BaseExpression:
        """Write the operation ``op`` of :data:`TARGETS` in the chosen style.

        Args:
            op: a key of :data:`TARGETS`.
            args: the arguments for ``ARGS`` / ``ARG0``.
            keep_call: for templates of the form ``name(ARGS)``, the call whose arguments (with
                their formatting and comments) are kept as they are; only the callee changes.

        Raises:
            NoEquivalent: the style has no spelling for ``op``.
        """
        target = TARGETS[op]
        template = target.npu_migrate if self.style == "npu_migrate" else target.torch
        if template is None:
            raise NoEquivalent(target.torch_missing or f"no {self.style} equivalent for {op}")
        if template.startswith(NM_ALIAS + ".") or f"({NM_ALIAS}." in template or f" {NM_ALIAS}." in template:
            self.needs_nm = True
        if "torch." in template:
            self.needs_torch = True
        if self.style == "torch":
            for helper in target.helpers:
                if helper not in self.helpers:
                    self.helpers.append(helper)
        tree = _rules.parse_template(template)
        if (
            keep_call is not None
            and isinstance(tree, cst.Call)
            and len(tree.args) == 1
            and isinstance(tree.args[0].value, cst.Name)
            and tree.args[0].value.value == "ARGS"
        ):
            node: cst.BaseExpression = keep_call.with_changes(func=tree.func)
        else:
            node = tree.visit(_Fill(args))  # type: ignore[assignment]
        self._emitted[id(node)] = (op, node)
        return node

    def is_emitted(self, node: cst.CSTNode, op: str) -> bool:
        """Whether ``node`` is what :meth:`emit` wrote for ``op`` in this run."""
        entry = self._emitted.get(id(node))
        return entry is not None and entry[0] == op and entry[1] is node


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

    def __init__(self, rules: Iterable[Rule], style: str = "npu_migrate") -> None:
        super().__init__()
        self.ctx = Context(style)
        self.by_type: dict[type, list[Rule]] = {}
        for rule in rules:
            for node_type in rule.nodes:
                self.by_type.setdefault(node_type, []).append(rule)
        self.changes: list[tuple] = []  # (Change, original node, fields...) until positions are known
        self.findings: list[tuple] = []
        self.changed = False
        self._deferred: list[tuple[cst.CSTNode, Finding]] = []
        self._stack: list[cst.CSTNode] = []

    # Attribute-level hooks are not used; skipping their dispatch saves a getattr per field.
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            self.ctx.add_import(node)
            self.ctx.in_import += 1
        elif isinstance(node, cst.Module):
            for stmt in node.body:  # module-level imports count for functions defined above them
                if isinstance(stmt, cst.SimpleStatementLine):
                    for small in stmt.body:
                        if isinstance(small, (cst.Import, cst.ImportFrom)):
                            self.ctx.add_import(small)
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        self._stack.pop()
        parent = self._stack[-1] if self._stack else None
        node_type = type(original_node)
        if node_type is cst.Import or node_type is cst.ImportFrom:
            self.ctx.in_import -= 1
        elif node_type is cst.Name:
            if not _is_reference(original_node, parent):  # type: ignore[arg-type]
                return updated_node
            if not self.ctx.in_import and original_node.value in self.ctx.aliases:  # type: ignore[attr-defined]
                name = original_node.value  # type: ignore[attr-defined]
                self.ctx.alias_uses[name] = self.ctx.alias_uses.get(name, 0) + 1
        elif node_type is cst.Module:
            return self._finish(original_node, updated_node)  # type: ignore[arg-type]
        rules = self.by_type.get(node_type)
        if not rules:
            return updated_node
        self.ctx.parent = parent
        self.ctx.node = original_node
        node = updated_node
        for rule in rules:
            try:
                hit = rule.match(node, self.ctx)
            except _rules_no_equivalent as exc:
                hit = Hit(None, f"not rewritten in --style {self.ctx.style}: {exc}",
                          "use --style npu_migrate, or port this site by hand")
            if hit is None:
                continue
            # Positions are looked up at the end, and only for files where something was found:
            # computing them costs about as much as parsing.
            if hit.replacement is None:
                finding = (Finding, original_node, rule.code, hit.message or rule.summary, hit.fix or rule.fix)
                if rule.code in DEFERRED:
                    self._deferred.append((node, finding))
                else:
                    self.findings.append(finding)
                continue
            before = original_node if node is updated_node else node
            self.changes.append((Change, original_node, rule.code, _snippet(before), _snippet(hit.replacement),
                                 hit.message))
            self.changed = True
            node = hit.replacement
            if type(node) is not node_type:
                break
        return node

    # -- end of module: imports, helpers, leftovers

    def _finish(self, original: cst.Module, module: cst.Module) -> cst.Module:
        if self._deferred:
            present: set[int] = set()

            class _Collect(cst.CSTVisitor):
                def visit_SimpleString(self, node: cst.SimpleString) -> None:
                    present.add(id(node))

            module.visit(_Collect())
            self.findings.extend(f for node, f in self._deferred if id(node) in present)
        if not self.changed:
            return module
        body = list(self._drop_imports(module.body))
        new_stmts: list[cst.BaseStatement] = []
        ctx = self.ctx
        if ctx.needs_torch and ctx.aliases.get("torch") != "torch":
            new_stmts.append(cst.parse_statement(TORCH_IMPORT + "\n"))
        if ctx.needs_nm and ctx.aliases.get(NM_ALIAS) != "npu_migrate":
            new_stmts.append(cst.parse_statement(NM_IMPORT + "\n"))
        defined = {s.name.value for s in body if isinstance(s, cst.FunctionDef)}
        helper_stmts = [
            cst.parse_statement(TORCH_HELPERS[h]) for h in TORCH_HELPERS if h in ctx.helpers and h not in defined
        ]
        if not new_stmts and not helper_stmts:
            return module.with_changes(body=body)
        at = self._insert_at(body)
        two_blank = [cst.EmptyLine(), cst.EmptyLine()]
        helper_stmts = [s.with_changes(leading_lines=two_blank) for s in helper_stmts]  # type: ignore[union-attr]
        if helper_stmts and at < len(body):
            nxt = body[at]
            lines = list(nxt.leading_lines)
            blanks = 0
            for line in lines:
                if line.comment is not None:
                    break
                blanks += 1
            if blanks < 2:
                body[at] = nxt.with_changes(leading_lines=[cst.EmptyLine()] * (2 - blanks) + lines)
        if at == 0 and body and new_stmts:
            # Keep a comment block or shebang at the top of the file above the new import.
            first = body[0]
            new_stmts[0] = new_stmts[0].with_changes(leading_lines=first.leading_lines)
            body[0] = first.with_changes(leading_lines=[])
        body[at:at] = new_stmts + helper_stmts
        return module.with_changes(body=body)

    @staticmethod
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

    def _drop_imports(self, body: Sequence[cst.BaseStatement]) -> Iterable[cst.BaseStatement]:
        """Drop ``from torch.cuda... import name`` for names whose every use was rewritten."""
        tables = list(self.ctx.import_cleanups.values())
        if not tables:
            yield from body
            return
        handled: set[str] = set().union(*tables)
        ctx = self.ctx
        carried: list[cst.EmptyLine] = []  # comments above a dropped import move to the next statement
        for stmt in body:
            if carried:
                stmt = stmt.with_changes(leading_lines=carried + list(stmt.leading_lines))  # type: ignore[union-attr]
                carried = []
            if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(stmt.body[0], cst.ImportFrom)):
                yield stmt
                continue
            imp = stmt.body[0]
            module = _dotted(imp.module) if imp.module is not None and not imp.relative else None
            if module is None or isinstance(imp.names, cst.ImportStar):
                yield stmt
                continue
            keep = []
            for alias in imp.names:
                local = alias.evaluated_alias or alias.evaluated_name
                uses = ctx.alias_uses.get(local, 0)
                if f"{module}.{alias.evaluated_name}" in handled and uses and uses == ctx.alias_rewrites.get(local, 0):
                    continue
                keep.append(alias)
            if len(keep) == len(imp.names):
                yield stmt
            elif keep:
                keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                yield stmt.with_changes(body=[imp.with_changes(names=keep)])
            else:
                carried = list(stmt.leading_lines)


_rules_no_equivalent = NoEquivalent


def transform(
    module: cst.Module, rules: Iterable[Rule], style: str = "npu_migrate", report_only: bool = False
) -> tuple[cst.Module, list[Change], list[Finding], bool]:
    """Port ``module`` with ``rules``.

    Args:
        module: the parsed source.
        rules: the rules to apply.
        style: ``"npu_migrate"`` or ``"torch"``.
        report_only: report what would be rewritten instead of rewriting it (``npu-migrate check``).

    Returns:
        The new module, the changes, the findings (sorted by position) and whether anything changed.
    """
    transformer = PortTransformer(rules, style)
    new = module.visit(transformer)
    changes: list[Change] = []
    findings: list[Finding] = []
    if transformer.changes or transformer.findings:
        positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)

        def place(record: tuple) -> Any:
            cls, node, code, *rest = record
            start = positions[node].start
            return cls(code, start.line, start.column + 1, *rest)

        changes = sorted(map(place, transformer.changes), key=lambda c: (c.line, c.col, c.code))
        findings = list(map(place, transformer.findings))
    if report_only:
        # The rewrites were made (so leftovers are judged as after a port) but are reported instead.
        findings = findings + [
            Finding(c.code, c.line, c.col, f"{c.before} -> {c.after}", "run npu-migrate port") for c in changes
        ]
        return module, [], sorted(findings, key=lambda f: (f.line, f.col, f.code)), False
    findings = sorted(findings, key=lambda f: (f.line, f.col, f.code))
    return new, changes, findings, transformer.changed
