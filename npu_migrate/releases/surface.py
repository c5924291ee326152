"""The public surface of a torch-npu release's ``torch_npu.npu``, read from its source with ``ast``.

Usage::

    from npu_migrate import releases
    from npu_migrate.releases import surface

    release = releases.find("2.14.0")
    names = surface.public_names(release)            # its __all__: 144 names in 2.14.0
    entry = surface.resolve(release, "set_device")   # followed through `from .utils import ...`
    entry.kind, entry.module, entry.signature()      # Kind.FUNCTION, "torch_npu.npu.utils", "(device)"
    surface.resolve(release, "mstx.mark").signature()  # a class member, a submodule's name

Nothing is imported: the wheel's modules are parsed as text, so this works without CANN, without
torch, on any platform. Each public name is followed to where it is defined, through the
wheel's own modules (``from .utils import x``, ``from .memory import *``, ``x = y`` and
``import``-bound modules). A name the wheel's Python never defines (the legacy tensor types,
``BoolTensor``...) is created by ``torch_npu._C`` at import and has no Python signature:
:attr:`Kind.NATIVE`. A class's signature is its constructor's (``__new__``, else ``__init__``,
else a base class's defined in the wheel), without ``cls``/``self``.

:func:`parameters_of` reads the same description from a live object (``inspect.signature``),
and :func:`same_default` compares a default written in source with a live default, so a stand-in
can be checked against the release (``tests/test_fake_npu_surface.py``); both live in
:mod:`npu_migrate.releases.signatures` with :class:`Parameter` (re-exported here).
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass
from typing import Optional

from npu_migrate.releases.signatures import (  # re-exported: their home before the split
    Parameter, format_parameters, from_arguments, parameters_of, same_default, same_parameters,
)
from npu_migrate.releases.wheels import Release

__all__ = ["PACKAGE", "Entry", "Kind", "Parameter", "defined_names", "format_parameters", "parameters_of",
           "public_names", "read", "resolve", "same_default", "same_parameters"]

PACKAGE = "torch_npu.npu"
"""The module whose ``__all__`` is ``torch.npu``'s public surface (torch_npu installs it as torch.npu)."""

_NATIVE_MODULE = "torch_npu._C"
_MAX_DEPTH = 24  # import chains in the wheel are a few links long; this stops a cycle


class Kind(enum.Enum):
    """What a public name is, as far as the release's Python source says."""

    FUNCTION = "function"
    CLASS = "class"
    MODULE = "module"
    VALUE = "value"  # an object built at import (``config = npu_config._npuConfig()``)
    NATIVE = "native"  # defined in C (torch_npu._C): no Python signature
    FOREIGN = "foreign"  # imported from outside the wheel (torch, the standard library)
    UNDEFINED = "undefined"  # named but not found; a reading error, reported as such


@dataclass(frozen=True)
class Entry:
    """A public name followed to its definition.

    Attributes:
        name: the name asked for (``set_device``, ``mstx.mark``).
        kind: what it is.
        module: the dotted module that defines it (``torch_npu.npu.utils``; the foreign module for FOREIGN).
        parameters: its signature, or ``None`` where there is no Python signature (NATIVE, VALUE,
            MODULE, FOREIGN, and classes whose constructor is native).
        note: why there is no signature, in words.
    """

    name: str
    kind: Kind
    module: str
    parameters: Optional[tuple[Parameter, ...]] = None
    note: str = ""

    def signature(self) -> Optional[str]:
        """``(device=None, *, x)`` style text, or ``None`` without a Python signature."""
        return None if self.parameters is None else format_parameters(self.parameters)


def _is_static(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)


def _dotted(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


class _Reader:
    """Parses a release's modules on demand and follows names between them."""

    def __init__(self, release: Release) -> None:
        self.release = release
        self._files = set(release.names())
        self._trees: dict[str, Optional[ast.Module]] = {}
        self._symbols: dict[str, tuple[dict[str, ast.AST], list[str]]] = {}

    # ------------------------------------------------------------------ modules

    def path(self, module: str) -> Optional[str]:
        base = module.replace(".", "/")
        for candidate in (f"{base}/__init__.py", f"{base}.py"):
            if candidate in self._files:
                return candidate
        return None

    def is_package(self, module: str) -> bool:
        return f"{module.replace('.', '/')}/__init__.py" in self._files

    def tree(self, module: str) -> Optional[ast.Module]:
        if module not in self._trees:
            path = self.path(module)
            self._trees[module] = None if path is None else ast.parse(self.release.read_text(path), path)
        return self._trees[module]

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        if not self.is_package(module):
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

    def symbols(self, module: str) -> tuple[dict[str, ast.AST], list[str]]:
        """Top-level bindings of ``module`` (the last wins) and its star-imported modules, in order."""
        if module in self._symbols:
            return self._symbols[module]
        bindings: dict[str, ast.AST] = {}
        stars: list[str] = []
        tree = self.tree(module)

        def visit(body: list[ast.stmt]) -> None:
            for stmt in body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    bindings[stmt.name] = stmt
                elif isinstance(stmt, ast.ImportFrom):
                    for alias in stmt.names:
                        if alias.name == "*":
                            stars.append(self.absolute(module, stmt))
                        else:
                            bindings[alias.asname or alias.name] = stmt
                elif isinstance(stmt, ast.Import):
                    for alias in stmt.names:
                        bindings[alias.asname or alias.name.split(".")[0]] = stmt
                elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    for target in targets:
                        if isinstance(target, ast.Name) and stmt.value is not None:
                            bindings[target.id] = stmt
                elif isinstance(stmt, ast.If):
                    visit(stmt.body)
                    visit(stmt.orelse)
                elif isinstance(stmt, ast.Try):
                    visit(stmt.body)
                    for handler in stmt.handlers:  # a fallback counts only where the try bound nothing
                        before = dict(bindings)
                        visit(handler.body)
                        bindings.update(before)

        if tree is not None:
            visit(tree.body)
        self._symbols[module] = (bindings, stars)
        return bindings, stars

    def exported(self, module: str) -> Optional[list[str]]:
        """``module``'s ``__all__`` when it is a literal list or tuple of strings (``+=`` included)."""
        tree = self.tree(module)
        if tree is None:
            return None
        names: Optional[list[str]] = None
        for stmt in tree.body:
            target = value = None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
            elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
                target, value = stmt.target, stmt.value
            if not (isinstance(target, ast.Name) and target.id == "__all__"):
                continue
            if isinstance(value, (ast.List, ast.Tuple)):
                found = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                names = (names or []) + found if isinstance(stmt, ast.AugAssign) else found
        return names

    # ------------------------------------------------------------------ names

    def resolve(self, module: str, name: str, depth: int = 0) -> Entry:
        head, _, rest = name.partition(".")
        entry = self._resolve_one(module, head, depth)
        if entry.name != head:
            entry = Entry(head, entry.kind, entry.module, entry.parameters, entry.note)
        if not rest:
            return entry
        if entry.kind is Kind.MODULE:
            found = self.resolve(entry.module, rest, depth + 1)
            return Entry(name, found.kind, found.module, found.parameters, found.note)
        if entry.kind is Kind.CLASS:
            return self._member(entry, name, rest)
        return Entry(name, entry.kind if entry.kind in (Kind.NATIVE, Kind.FOREIGN) else Kind.UNDEFINED,
                     entry.module, None, f"a member of {head}, which is {entry.kind.value}")

    def _member(self, owner: Entry, name: str, member: str) -> Entry:
        node = self._class_node(owner.module, owner.name.rpartition(".")[2])
        for stmt in node.body if node is not None else []:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == member:
                return Entry(name, Kind.FUNCTION, owner.module, from_arguments(stmt.args, not _is_static(stmt)))
        return Entry(name, Kind.UNDEFINED, owner.module, None, f"{member} is not defined in class {owner.name}")

    def _class_node(self, module: str, name: str) -> Optional[ast.ClassDef]:
        bindings, _ = self.symbols(module)
        node = bindings.get(name)
        return node if isinstance(node, ast.ClassDef) else None

    def _resolve_one(self, module: str, name: str, depth: int) -> Entry:
        if depth > _MAX_DEPTH:
            return Entry(name, Kind.UNDEFINED, module, None, "an import cycle")
        if module == _NATIVE_MODULE or module.startswith(_NATIVE_MODULE + "."):
            return Entry(name, Kind.NATIVE, module, None, f"defined in C ({module}): no Python signature")
        if self.tree(module) is None:
            sub = f"{module}.{name}"
            if self.path(sub) is not None:
                return Entry(name, Kind.MODULE, sub)
            return Entry(name, Kind.FOREIGN, module, None, f"imported from {module}, which is not part of torch_npu")
        bindings, stars = self.symbols(module)
        node = bindings.get(name)
        if node is None:
            for star in reversed(stars):
                if self.tree(star) is None:
                    continue
                exported = self.exported(star)
                star_bindings, star_stars = self.symbols(star)
                if (name in exported) if exported is not None else (name in star_bindings or bool(star_stars)):
                    found = self._resolve_one(star, name, depth + 1)
                    if found.kind is not Kind.UNDEFINED:
                        return found
            if self.path(f"{module}.{name}") is not None:
                return Entry(name, Kind.MODULE, f"{module}.{name}")
            return Entry(name, Kind.NATIVE, _NATIVE_MODULE, None,
                         "not defined in the release's Python: torch_npu._C creates it at import, no Python signature")
        return self._entry(module, name, node, depth)

    def _entry(self, module: str, name: str, node: ast.AST, depth: int) -> Entry:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Entry(name, Kind.FUNCTION, module, from_arguments(node.args, drop_first=False))
        if isinstance(node, ast.ClassDef):
            return self._class(module, node, depth)
        if isinstance(node, ast.ImportFrom):
            source = self.absolute(module, node)
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            if source.split(".")[0] != "torch_npu":
                return Entry(name, Kind.FOREIGN, source, None, f"imported from {source}, which is not part of torch_npu")
            found = self._resolve_one(source, original, depth + 1)
            return Entry(name, found.kind, found.module, found.parameters, found.note)
        if isinstance(node, ast.Import):
            alias = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == name)
            target = alias.name if alias.asname else alias.name.split(".")[0]
            kind = Kind.MODULE if self.path(target) is not None else Kind.FOREIGN
            return Entry(name, kind, target)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            if isinstance(value, ast.Lambda):
                return Entry(name, Kind.FUNCTION, module, from_arguments(value.args, drop_first=False))
            dotted = _dotted(value) if value is not None else None
            if dotted is not None and dotted != name:
                head, _, rest = dotted.partition(".")
                base = self._resolve_one(module, head, depth + 1)
                if not rest:
                    return Entry(name, base.kind, base.module, base.parameters, base.note)
                if base.kind is Kind.MODULE:
                    found = self.resolve(base.module, rest, depth + 1)
                    return Entry(name, found.kind, found.module, found.parameters, found.note)
                return Entry(name, Kind.VALUE if base.kind is not Kind.FOREIGN else Kind.FOREIGN,
                             base.module, None, f"= {dotted}")
            text = ast.unparse(value) if value is not None else "?"
            return Entry(name, Kind.VALUE, module, None, f"an object built at import: {text}")
        return Entry(name, Kind.UNDEFINED, module, None, f"bound by a {type(node).__name__}")

    def _class(self, module: str, node: ast.ClassDef, depth: int) -> Entry:
        for special in ("__new__", "__init__"):
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == special:
                    return Entry(node.name, Kind.CLASS, module, from_arguments(stmt.args, drop_first=True))
        for base in node.bases:
            dotted = _dotted(base)
            if dotted is None or dotted == "object":
                continue
            if dotted.startswith(_NATIVE_MODULE + ".") or dotted.startswith("torch_npu._C."):
                return Entry(node.name, Kind.CLASS, module, None, f"its constructor is {dotted}'s, defined in C")
            head, _, rest = dotted.partition(".")
            found = self._resolve_one(module, head, depth + 1)
            if rest and found.kind is Kind.MODULE:
                found = self.resolve(found.module, rest, depth + 1)
            if found.kind is Kind.CLASS:
                return Entry(node.name, Kind.CLASS, module, found.parameters,
                             found.note or f"its constructor is {dotted}'s")
            if found.kind in (Kind.FOREIGN, Kind.NATIVE):
                return Entry(node.name, Kind.CLASS, module, None,
                             f"its constructor is {dotted}'s ({found.module}), not in the release's Python")
        return Entry(node.name, Kind.CLASS, module, ())


def public_names(release: Release, module: str = PACKAGE) -> list[str]:
    """``module``'s ``__all__`` in ``release`` (``torch_npu.npu``'s public names), in its order.

    Raises:
        ValueError: the module has no literal ``__all__``.
    """
    names = _Reader(release).exported(module)
    if names is None:
        raise ValueError(f"{module} in torch-npu {release.version} has no literal __all__")
    return names


def defined_names(release: Release, module: str = PACKAGE) -> list[str]:
    """The public names ``module`` defines itself (functions, classes, assignments; not imports),
    for a module without ``__all__`` such as a stand-in's."""
    bindings, _ = _Reader(release).symbols(module)
    return sorted(name for name, node in bindings.items()
                  if not name.startswith("_") and not isinstance(node, (ast.Import, ast.ImportFrom)))


def resolve(release: Release, name: str, module: str = PACKAGE) -> Entry:
    """Follow ``name`` (``set_device``, ``mstx.mark``, ``amp.GradScaler``) from ``module`` to its definition."""
    return _Reader(release).resolve(module, name)


def read(release: Release, module: str = PACKAGE, extra: tuple[str, ...] = ()) -> dict[str, Entry]:
    """Every public name of ``module`` (and the dotted ``extra`` names), resolved, in ``__all__`` order."""
    reader = _Reader(release)
    names = reader.exported(module)
    if names is None:
        raise ValueError(f"{module} in torch-npu {release.version} has no literal __all__")
    return {name: reader.resolve(module, name) for name in [*names, *extra]}
