"""The matcher API: what a port rule sees (:class:`Context`) and what it returns (:class:`Hit`).

Usage::

    from npu_migrate.port.context import Context, Hit

    def match(node: cst.Call, ctx: Context) -> Hit | None:
        if ctx.qualname(node.func) == "torch.cuda.synchronize":
            return Hit(ctx.emit("synchronize"))
        return None

Names are resolved with libcst's scope analysis (``ScopeProvider`` and its qualified names, the
same answers ``QualifiedNameProvider`` gives), so a function-local ``import torch.cuda as tc``, a
parameter called ``torch`` or a shadowing variable resolve the way Python resolves them. The
analysis runs the first time a matcher asks about a name, and only for the names it asks about;
matchers look at the syntax first, so most names are never asked about. :meth:`Context.emit` writes a device-neutral operation of
:data:`npu_migrate.port.targets.TARGETS` in the chosen style; the transformer adds the imports and
helper functions the written code needs (decided from the emitted syntax trees, never from text).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import libcst as cst
from libcst.metadata import QualifiedName, QualifiedNameSource

from npu_migrate.port.targets import NM_ALIAS, TARGETS

# Names that mean their module where nothing in the file binds them (snippets, cells, star imports).
ASSUMED_MODULES = frozenset({"torch", "torch_npu", "os"})
LOCAL = "<local>."  # prefix of qualname() for names bound by an assignment or parameter, not an import


class NoEquivalent(Exception):
    """The chosen output style has no spelling for an operation (see ``Target.torch_missing``)."""


@dataclass(frozen=True)
class Hit:
    """What a matcher found at one node.

    Attributes:
        replacement: the node to put in place of the matched one; ``None`` reports only.
        message: one line saying what was changed or why it needs a human.
        fix: the suggested fix for a finding (defaults to the rule's).
    """

    replacement: Optional[cst.CSTNode] = None
    message: str = ""
    fix: str = ""


Matcher = Callable[[cst.CSTNode, "Context"], Optional[Hit]]


@dataclass(frozen=True)
class Rule:
    """One row of the rule table.

    Attributes:
        code: ``NMxxx``; ``NM0xx`` rewrite, ``NM1xx`` report.
        name: a short slug.
        summary: one line: what the rule rewrites or reports.
        fix: the suggested fix (for a rewrite: what it writes instead).
        nodes: libcst node classes the matcher is called with (after their children were ported).
        match: the matcher.
        triggers: regular expressions of which a file must contain a match for the rule to fire; a
            file that matches none of any enabled rule's is not parsed at all.
    """

    code: str
    name: str
    summary: str
    fix: str
    nodes: tuple[type, ...]
    match: Matcher
    triggers: tuple[str, ...]
    rewrites: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rewrites", self.code.startswith("NM0"))


@functools.lru_cache(maxsize=None)
def parse_template(text: str) -> cst.BaseExpression:
    """Parse a :data:`TARGETS` template once per process."""
    return cst.parse_expression(text)


def dotted(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` for a chain of attributes on a name, else ``None``."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def resolve(names: Iterable[QualifiedName], text: str) -> tuple[str, str]:
    """What :meth:`Context.qualname` answers from libcst's qualified names of one node, and the binding.

    Returns:
        ``(name, binding)``: binding is ``"import"``, ``"local"`` (an assignment or parameter) or
        ``"none"`` (a builtin, or a name bound nowhere in this file).
    """
    local = False
    for q in names:
        if q.source is QualifiedNameSource.IMPORT:
            return q.name, "import"
        if q.source is QualifiedNameSource.LOCAL:
            local = True
    if local:
        return LOCAL + text, "local"
    if text.split(".")[0] in ASSUMED_MODULES:
        return text, "import"  # a snippet or notebook cell that uses torch without importing it here
    return text, "none"


class _Fill(cst.CSTTransformer):
    """Put a call's arguments into a template and the chosen alias in place of ``nm``.

    ``ARGS`` takes all the arguments, ``ARG0`` the first value.
    """

    def __init__(self, args: Sequence[cst.Arg], alias: str) -> None:
        super().__init__()
        self.args = list(args)
        self.alias = alias
        self.names: set[str] = set()

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
        if out:
            out[-1] = out[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(args=out)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if updated_node.value == "ARG0" and self.args:
            return self.args[0].value
        if updated_node.value == NM_ALIAS:
            self.names.add(NM_ALIAS)
            return updated_node.with_changes(value=self.alias)
        self.names.add(updated_node.value)
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        self.names.discard(updated_node.attr.value)  # an attribute's name is not a variable
        return updated_node


def rename_keywords(args: Sequence[cst.Arg], renames: Mapping[str, str]) -> list[cst.Arg]:
    """``args`` with keyword names mapped through ``renames`` (to ``""``: passed positionally)."""
    out = []
    for arg in args:
        if arg.keyword is not None and arg.keyword.value in renames:
            new = renames[arg.keyword.value]
            if new:
                arg = arg.with_changes(keyword=cst.Name(new))
            else:
                arg = arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
        out.append(arg)
    return out


_PLAIN_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)[ \t]*(?:#.*)?$", re.M)


def plain_imports(source: str) -> frozenset[str]:
    """Module names bound only by a plain ``import H`` and used only as ``H.attr`` anywhere in ``source``.

    For these a name's meaning is its text (``torch.cuda.synchronize``), so the scope analysis can
    be skipped; any other mention (a parameter, an assignment, ``as H``, a bare ``H`` in a
    docstring) leaves the name to the scope analysis. Mentions after ``from`` and in comments are
    ignored, except an assignment (``torch = ...``) anywhere.
    """
    heads = {name.strip().split(".")[0] for m in _PLAIN_IMPORT.finditer(source) for name in m.group(1).split(",")}
    plain = set()
    import_lines = [(m.start(), m.end()) for m in _PLAIN_IMPORT.finditer(source)]
    for head in heads:
        ok = True
        for m in re.finditer(rf"(?<![\w.]){re.escape(head)}\b", source):
            if any(a <= m.start() < b for a, b in import_lines):
                continue
            if re.search(r"\bfrom[ \t]+$", source[max(0, m.start() - 20):m.start()]):
                continue  # `from torch import nn` binds nn, not torch
            if re.match(r"[ \t]*(=[^=]|:=)", source[m.end():m.end() + 4]):
                ok = False  # an assignment, even after a "#" inside a string
                break
            if "#" in source[source.rfind("\n", 0, m.start()) + 1:m.start()]:
                continue  # prose in a comment
            if not source.startswith(".", m.end()):
                ok = False
                break
        if ok:
            plain.add(head)
    return frozenset(plain)


class Context:
    """What a matcher may ask: resolved names, the enclosing nodes, and :meth:`emit`.

    Attributes:
        style: ``"npu_migrate"`` or ``"torch"``.
        parent: the original parent of the node being matched.
        node: the original node being matched.
        stack: the original nodes from the module down to the parent.
        alias: the name ``npu_migrate`` is imported as (``nm`` unless that name is taken).
    """

    def __init__(self, style: str, alias: str = NM_ALIAS) -> None:
        self.style = style
        self.alias = alias
        self.parent: Optional[cst.CSTNode] = None
        self.node: Optional[cst.CSTNode] = None
        self.stack: list[cst.CSTNode] = []
        self.in_import = 0
        self.needs: set[str] = set()  # module names the emitted code reads (nm, torch, os...)
        self.helpers: list[str] = []
        self.rewritten_heads: set[str] = set()  # names bound by imports whose uses were rewritten
        self.own_device_methods: frozenset[str] = frozenset()  # "cuda"/"npu" when the file defines such a method
        self.dropped_imports: list[cst.CSTNode] = []  # imports to remove once nothing uses them
        self.import_heads: set[str] = set()  # local names imports of report-only APIs bound (cp for cupy)
        self._origin: dict[int, tuple[cst.CSTNode, cst.CSTNode]] = {}  # id(node) -> (node, original node)
        self._resolved: dict[int, tuple[str, str]] = {}  # id(original) -> (qualname, binding)
        self._scopes: Optional[Callable[[], Mapping[cst.CSTNode, Any]]] = None
        # Heads whose every mention is `import H` or `H.attr`: bound by that import alone (see plain_imports)
        self.plain_import_heads: frozenset[str] = frozenset()
        self._scope_map: Optional[Mapping[cst.CSTNode, Any]] = None
        self._emitted: dict[int, tuple[str, cst.CSTNode]] = {}

    # -- names

    def use_scopes(self, scopes: Callable[[], Mapping[cst.CSTNode, Any]]) -> None:
        """Give the function that computes libcst's ScopeProvider map; it runs on the first question."""
        self._scopes = scopes

    def note_origin(self, node: cst.CSTNode, original: cst.CSTNode) -> None:
        """Record that ``node`` (in the tree being built) is ``original`` (in the parsed tree) ported."""
        self._origin[id(node)] = (node, original)
        self._origin[id(original)] = (original, original)

    def _resolve(self, node: cst.CSTNode) -> Optional[tuple[str, str]]:
        entry = self._origin.get(id(node))
        if entry is None or entry[0] is not node:
            return None
        original = entry[1]
        done = self._resolved.get(id(original))
        if done is not None:
            return done
        text = dotted(original)
        if text is None:
            return None
        head = text.split(".")[0]
        if head in self.plain_import_heads:
            done = self._resolved[id(original)] = (text, "import")
            return done
        if self._scope_map is None:
            # Scope analysis runs only once a matcher asks about a name, i.e. only in files with a
            # real candidate; a file that merely mentions "cuda" in a docstring never pays for it.
            self._scope_map = self._scopes() if self._scopes is not None else {}
        scope = self._scope_map.get(original)
        names = scope.get_qualified_names_for(original) if scope is not None else ()
        done = self._resolved[id(original)] = resolve(names, text)
        return done

    def qualname(self, node: cst.CSTNode) -> Optional[str]:
        """What a name or attribute chain refers to.

        Returns:
            The full dotted name for a chain whose head an import binds (``tc.sync`` ->
            ``torch.cuda.sync``); ``"<local>." + text`` when an assignment or parameter binds
            the head (``def f(torch): torch.cuda...``); the text itself when nothing in the file
            binds it; ``None`` for anything that is not a dotted name.
        """
        done = self._resolve(node)
        return done[0] if done is not None else dotted(node)

    def binding(self, node: cst.CSTNode) -> str:
        """How ``node``'s head name is bound: ``"import"``, ``"local"`` or ``"none"``."""
        done = self._resolve(node)
        return done[1] if done is not None else "none"

    def parent_qualname_startswith(self, prefix: str) -> bool:
        """Whether the parent is a longer dotted name that also starts with ``prefix``."""
        parent = self.parent
        if not isinstance(parent, cst.Attribute):
            return False
        qual = self.qualname(parent)
        return qual is not None and qual.startswith(prefix)

    def ancestor(self, level: int) -> Optional[cst.CSTNode]:
        """The original node ``level`` steps above the matched one (1 is the parent)."""
        return self.stack[-level] if len(self.stack) >= level else None

    def count_rewrite(self, func: cst.CSTNode) -> None:
        """Note that a use of an imported name was rewritten, so its import may become unused."""
        head = func
        while isinstance(head, cst.Attribute):
            head = head.value
        if isinstance(head, cst.Name):
            self.rewritten_heads.add(head.value)

    def drop_import(self, node: cst.CSTNode) -> None:
        """Remove the names ``node`` (an original import) binds, where nothing uses them after the port."""
        self.dropped_imports.append(node)

    # -- output

    def emit(self, op: str, args: Sequence[cst.Arg] = (), keep_call: Optional[cst.Call] = None) -> cst.BaseExpression:
        """Write the operation ``op`` of :data:`TARGETS` in the chosen style.

        Args:
            op: a key of :data:`TARGETS`.
            args: the arguments for ``ARGS`` / ``ARG0``; keyword names are mapped to the target's.
            keep_call: for templates of the form ``name(ARGS)``, the call whose arguments (with
                their formatting and comments) are kept; only the callee and keyword names change.

        Raises:
            NoEquivalent: the style has no spelling for ``op``.
        """
        target = TARGETS[op]
        template = target.template(self.style)
        if template is None:
            raise NoEquivalent(target.torch_missing or f"no {self.style} equivalent for {op}")
        renames = target.keywords(self.style)
        if renames:
            args = rename_keywords(args, renames)
            if keep_call is not None:
                keep_call = keep_call.with_changes(args=rename_keywords(keep_call.args, renames))
        for helper in target.helpers(self.style):
            if helper not in self.helpers:
                self.helpers.append(helper)
        fill = _Fill(args, self.alias)
        tree = parse_template(template)
        if (
            keep_call is not None
            and isinstance(tree, cst.Call)
            and len(tree.args) == 1
            and isinstance(tree.args[0].value, cst.Name)
            and tree.args[0].value.value == "ARGS"
        ):
            node: cst.BaseExpression = keep_call.with_changes(func=tree.func.visit(fill))
        else:
            node = tree.visit(fill)  # type: ignore[assignment]
        self.needs |= fill.names & {NM_ALIAS, "torch", "os"}
        self._emitted[id(node)] = (op, node)
        return node

    def is_emitted(self, node: cst.CSTNode, op: str) -> bool:
        """Whether ``node`` is what :meth:`emit` wrote for ``op`` in this run."""
        entry = self._emitted.get(id(node))
        return entry is not None and entry[0] == op and entry[1] is node
