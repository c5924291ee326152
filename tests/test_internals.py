"""The inventory of private internals (npu_migrate/internals.py) is true on this torch, and complete.

Run on both torch tiers: each entry is resolved and fails by its name when the installed torch (or
Python) lacks it; the package's source is read with ``ast`` and a private name of torch, the stdlib
or another library that the inventory does not list fails by name and module; an entry that names a
module which no longer uses it fails too, so the list stays what the code does.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from npu_migrate import internals
from npu_migrate.internals import INTERNALS, Internal

PACKAGE = Path(internals.__file__).resolve().parent
OWN_MARKER = "_npu_migrate"
"""Attributes npu_migrate sets on foreign objects (``fn._npu_migrate_guarded``): its own names."""
FOREIGN_ROOTS = frozenset(sys.stdlib_module_names) | {"torch", "s3fs", "fsspec", "libcst"}


@pytest.mark.parametrize("entry", INTERNALS, ids=lambda e: e.name)
def test_entry_resolves_on_this_torch(entry: Internal) -> None:
    if not internals.applies(entry, torch.__version__):
        pytest.skip(f"not needed on torch {torch.__version__} (since {entry.since}, until {entry.until}, "
                    f"extra {entry.extra})")
    why = internals.resolve(entry)
    assert why is None, (f"{entry.name} is gone on torch {torch.__version__} ({why}): {', '.join(entry.used_in)} "
                         f"relied on it for: {entry.why}")


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _chain(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _defined_by_us(trees: dict[str, ast.Module]) -> set[str]:
    """Every name the package defines: a private ``obj._x`` outside this set belongs to someone else."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _chain(node.value) in (
                    ["self"], ["cls"]):
                names.add(node.attr)
            elif isinstance(node, ast.Dict):  # type(name, bases, {"_api": ...}) class bodies
                names.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("npu_migrate")):
                names.update(a.asname or a.name for a in node.names)
    return names


def private_uses() -> dict[str, set[str]]:
    """``{private name: {module, ...}}`` for the whole package.

    ``torch._C._jit_get_all_schemas`` for a chain on an imported foreign module (up to its last private
    part), ``.name`` for a private attribute of an object of unknown type that the package does not
    define (``handler._stop_heartbeats``); ``getattr``/``hasattr``/``setattr`` with a literal name count.
    """
    trees = {p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text(encoding="utf-8"), str(p))
             for p in sorted(PACKAGE.rglob("*.py"))}
    ours = _defined_by_us(trees)
    found: dict[str, set[str]] = {}

    def add(name: str, module: str) -> None:
        if name.lstrip(".") not in internals.ALLOWED and name not in internals.ALLOWED:
            found.setdefault(name, set()).add(module)

    for module, tree in trees.items():
        alias: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in FOREIGN_ROOTS:
                        alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                        if any(map(_private, a.name.split("."))):
                            add(a.name, module)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.split(".")[0] in FOREIGN_ROOTS:
                    for a in node.names:
                        alias[a.asname or a.name] = full = f"{node.module}.{a.name}"
                        if any(map(_private, full.split("."))):
                            add(full, module)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and not isinstance(parents.get(node), ast.Attribute):
                parts = _chain(node)
                if parts and parts[0] in alias:
                    full = alias[parts[0]].split(".") + parts[1:]
                    private = [i for i, p in enumerate(full) if i and _private(p)]
                    if private:
                        add(".".join(full[: private[-1] + 1]), module)
                        continue
            if isinstance(node, ast.Attribute) and _private(node.attr) and not node.attr.startswith(OWN_MARKER) \
                    and node.attr not in ours:
                add("." + node.attr, module)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value
                if _private(name) and not name.startswith(OWN_MARKER):
                    base = _chain(node.args[0])
                    if base and base[0] in alias:
                        add(".".join(alias[base[0]].split(".") + base[1:] + [name]), module)
                    elif name not in ours:
                        add("." + name, module)
    return found


def _listed(name: str) -> bool:
    paths = [path for entry in INTERNALS for path in entry.names]
    if name.startswith("."):  # an attribute of an object of unknown type: some entry names it
        return any(name[1:] in path.split(".") for path in paths)
    return any(path == name or path.startswith(name + ".") for path in paths)


@pytest.mark.slow
def test_every_private_name_the_package_uses_is_listed() -> None:
    uses = private_uses()
    assert "torch._C._jit_get_all_schemas" in uses and ".pg_map" not in uses  # the scan sees what it should
    unlisted = {name: sorted(modules) for name, modules in uses.items() if not _listed(name)}
    assert not unlisted, ("private names used but not listed in npu_migrate/internals.py (add an entry: where, "
                          f"why, since which torch): {unlisted}")


@pytest.mark.parametrize("entry", INTERNALS, ids=lambda e: e.name)
def test_entry_is_still_used_where_it_says(entry: Internal) -> None:
    leaves = {path.rsplit(".", 1)[-1] for path in entry.names}
    for module in entry.used_in:
        text = (PACKAGE / module).read_text(encoding="utf-8")
        assert any(leaf in text for leaf in leaves), f"{module} no longer uses {entry.name}: update the inventory"
