"""The package's layout holds: docstrings, no import cycles, no upward imports, wings, every module on the map.

Read from the sources with :mod:`ast` in this process; nothing under npu_migrate/ is imported, so the
test costs no torch. What is checked:

* every module opens with a docstring (what it owns);
* no cycle among npu_migrate's module-level imports (what runs at ``import``). Imports inside a
  function run later and may close a cycle safely; those cycles are listed by
  :func:`test_lazy_import_cycles_are_known`, so a new one is seen;
* no upward import: each *unit* (a subpackage, or a top-level module) may import only the units
  ``FLOORS`` lists for it, function-level imports included (a lazy import is still a dependency);
  ``KNOWN_UPWARD`` lists the imports waiting for a fix, each with its reason;
* docs/architecture.md's "Import floors": the modules it lists as torch-free or torch-lazy import no
  torch at module level, and the torch-free tools import none at all;
* one concept per module: a module over ``MAX_LINES`` lines says why in ``LONG_MODULES`` (and no
  entry stays for a module that is no longer long); modules are split by purpose, never by size;
* a folder with more than ``MAX_FOLDER_MODULES`` modules gets wings (subpackages by concept, as
  ``torch.distributed.elastic`` keeps ``agent/``, ``rendezvous/``, ``multiprocessing/``);
* every module is named in its package's docstring and in docs/architecture.md's map, so a
  newcomer finds it from either.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "npu_migrate"
MAX_LINES = 800
MAX_FOLDER_MODULES = 15

# A module over MAX_LINES needs its reason here, and only here.
LONG_MODULES: dict[str, str] = {
}

# A folder over MAX_FOLDER_MODULES modules needs its reason here, and only here.
CROWDED_FOLDERS: dict[str, str] = {
    "npu_migrate": "the package's root: each module is a unit of its own in FLOORS (the shared helpers, the "
                   "device layer, the entry points), and users import several by path (npu_migrate.errors, "
                   "npu_migrate.distributed, npu_migrate.auto)",
}

# Units, lowest first. A unit is a subpackage of npu_migrate or one of its top-level modules;
# each may import itself and the units listed for it, nothing else.
BASE = frozenset({"errors", "log", "textsafe", "redact", "fileio", "registry", "argparsing", "_torch_hook",
                  "cuda_api", "npu_lines", "failure_hints"})
"""Standard-library helpers every layer uses (errors, safe text, private files, the device and CUDA tables,
the failing process's hints)."""
DEVICE = frozenset({"autoload", "device", "distributed", "_exit", "__init__"})
"""Device selection and the process group; ``__init__`` is the lazy facade over them (PEP 562)."""
ENTRY = frozenset({"cli", "__main__", "_preload", "auto", "smoke", "env", "_bootstrap"})
"""Entry points: the sub-command table, ``import npu_migrate.auto``, the fork server's preload, the
start-up hook, and the small commands that drive several units. They may import anything."""

FLOORS: dict[str, frozenset[str]] = {
    **{unit: BASE for unit in BASE},  # among themselves: no cycle (checked below) is the only rule
    "releases": BASE,                  # the wheel reader: below the device layer, which asks it about pairs
    **{unit: BASE | DEVICE | {"releases"} for unit in DEVICE},
    "libs": BASE | DEVICE,             # CUDA-only libraries kept working: read by migrate's hook and port
    "data": BASE | DEVICE,             # storage and the dataset cache
    "port": BASE | {"libs"},           # the torch-free codemod: never the device layer
    "optim_steps": BASE,               # every optimizer step seen, whatever torch.compile did to torch's hooks
    "compare": BASE | DEVICE | {"optim_steps"},  # recording (probe.py) and the torch-free readers
    "launch": BASE | DEVICE,           # the launcher: features plug into it, it imports none of them
    # --profile: the profiler driven by the optimizer steps (recorder.py) and its torch-free summary
    "profile": BASE | DEVICE | {"optim_steps"},
    "migrate": BASE | DEVICE | {"libs", "launch", "compare", "profile"},  # runtime migration, `run` (--probe, --profile)
    # the operator audit runs under migration; libs: the CUDA-only libraries' table (libs/table.py)
    "ops": BASE | DEVICE | {"releases", "migrate", "launch", "optim_steps", "libs"},
    # `npu-migrate advise`: watches the operator audit's run (ops) and reads what the release offers
    "advise": BASE | DEVICE | {"releases", "migrate", "launch", "optim_steps", "libs", "ops"},
    "internals": frozenset(),          # the inventory of private names: reads the others as text only
}

# Upward imports waiting for a fix, (importer, imported) -> reason. Remove an entry with its import.
KNOWN_UPWARD: dict[tuple[str, str], str] = {
}

# docs/architecture.md, "Import floors": modules that import no torch at module level.
TORCH_FREE_AT_IMPORT = (
    # standard library only
    "npu_migrate/__init__.py", "npu_migrate/cli.py", "npu_migrate/argparsing.py", "npu_migrate/errors.py",
    "npu_migrate/registry.py", "npu_migrate/log.py", "npu_migrate/textsafe.py", "npu_migrate/redact.py",
    "npu_migrate/fileio.py", "npu_migrate/autoload.py", "npu_migrate/_exit.py", "npu_migrate/_torch_hook.py",
    "npu_migrate/_bootstrap/sitecustomize.py", "npu_migrate/migrate/hook.py", "npu_migrate/migrate/environment.py",
    "npu_migrate/compare/recording/_hook.py", "npu_migrate/compare/recording/settings.py", "npu_migrate/launch/hangs/stacks.py",
    "npu_migrate/npu_lines.py", "npu_migrate/failure_hints.py", "npu_migrate/releases/",
    "npu_migrate/profile/__init__.py", "npu_migrate/profile/settings.py", "npu_migrate/profile/_hook.py",
    "npu_migrate/profile/summary.py", "npu_migrate/profile/launch_feature.py",
    # torch inside functions only
    "npu_migrate/env.py", "npu_migrate/smoke.py", "npu_migrate/migrate/cli.py",
    "npu_migrate/ops/cli.py", "npu_migrate/data/cache.py", "npu_migrate/migrate/usercode.py",
    "npu_migrate/advise/cli.py", "npu_migrate/advise/replacements.py", "npu_migrate/advise/environment.py",
    "npu_migrate/migrate/callers.py",
    # torch after the fork server
    "npu_migrate/launch/__init__.py", "npu_migrate/launch/cli.py", "npu_migrate/launch/setup/config.py",
    "npu_migrate/launch/procs/supervisor.py", "npu_migrate/launch/nodes/servers.py",
    "npu_migrate/launch/nodes/membership.py", "npu_migrate/launch/nodes/store.py",
    "npu_migrate/launch/api.py",
)
# The torch-free tools: no torch anywhere, except the functions named (which the tests call).
NO_TORCH = ("npu_migrate/port/", "npu_migrate/cuda_api", "npu_migrate/compare/", "npu_migrate/data/")
NO_TORCH_EXCEPT = {
    "npu_migrate/data/cache.py": "the node's download collective (torch.distributed inside functions)",
    # compare/'s recorder runs in the ranks, torch at import; its readers never import torch
    "npu_migrate/compare/recording/probe.py": "the recorder",
    "npu_migrate/compare/recording/module_hooks.py": "the recorder's per-module hooks",
    "npu_migrate/compare/recording/stats.py": "the recorder's statistics, on the device",
    "npu_migrate/compare/recording/writer.py:create": "the recorder's device fence (torch.cuda.Event, torch.npu.Event)",
    # "path:function": torch inside that function only (a path names a module, or a package without ".py")
    "npu_migrate/cuda_api:public_names": "reads torch.cuda's names for the tests",
    "npu_migrate/cuda_api:device_apis": "reads torch's functions for the tests",
    "npu_migrate/cuda_api:tensor_cuda_apis": "reads torch.Tensor's names for the tests",
}


@dataclass(frozen=True)
class Import:
    """One import of an npu_migrate module: who, what, and whether it runs at import time."""

    importer: str
    imported: str
    lazy: bool          # inside a function: runs when called
    type_only: bool     # under ``if TYPE_CHECKING:``: never runs
    function: str       # the enclosing function's name, "" at module level
    line: int


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@lru_cache(maxsize=None)
def tree(name: str) -> ast.Module:
    path = modules()[name]
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _target(importer: str, node: ast.ImportFrom, alias: str) -> str:
    if node.level:
        base = importer.split(".")
        if modules()[importer].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    candidate = f"{module}.{alias}"
    return candidate if candidate in modules() else module


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


@lru_cache(maxsize=None)
def all_imports(name: str) -> tuple[Import, ...]:
    """Every import statement of one module, npu_migrate's and others', each with where it runs."""
    found: list[Import] = []

    def walk(node: ast.AST, function: str, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                walk(child, function or getattr(child, "name", "<lambda>"), type_only)
                continue
            if isinstance(child, ast.If) and _is_type_checking(child):
                walk(child, function, True)
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                targets = [_target(name, child, a.name) for a in child.names]
            for target in targets:
                found.append(Import(name, target, bool(function), type_only, function, child.lineno))
            walk(child, function, type_only)

    walk(tree(name), "", False)
    return tuple(found)


@lru_cache(maxsize=None)
def imports() -> tuple[Import, ...]:
    """The imports of npu_migrate modules by npu_migrate modules."""
    return tuple(i for name in modules() for i in all_imports(name)
                 if i.imported == "npu_migrate" or i.imported.startswith("npu_migrate."))


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        if a != b:
            graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def unit(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _relative(name: str) -> str:
    return modules()[name].relative_to(ROOT).as_posix()


def test_every_module_has_a_docstring() -> None:
    missing = [_relative(n) for n in modules() if not (ast.get_docstring(tree(n)) or "").strip()]
    assert not missing, f"modules without a docstring saying what they own: {missing}"


def test_no_import_cycles_at_module_level() -> None:
    edges = {(i.importer, i.imported) for i in imports() if not i.lazy and not i.type_only}
    cycles = _cycles(edges)
    assert not cycles, f"module-level import cycles: {cycles}; move an import into the function that needs it, " \
                       "or the shared name into a lower module"


# Cycles closed only by imports inside functions: safe at import time, listed so a new one is noticed.
KNOWN_LAZY_CYCLES: dict[tuple[str, ...], str] = {
}


def test_lazy_import_cycles_are_known() -> None:
    edges = {(i.importer, i.imported) for i in imports() if not i.type_only}
    cycles = [tuple(c) for c in _cycles(edges)]
    new = [c for c in cycles if c not in KNOWN_LAZY_CYCLES]
    assert not new, f"import cycles closed inside functions: {new}; break them, or list them in KNOWN_LAZY_CYCLES " \
                    "with the reason"
    gone = [c for c in KNOWN_LAZY_CYCLES if c not in cycles]
    assert not gone, f"KNOWN_LAZY_CYCLES entries that are no cycle any more (remove them): {gone}"


def test_every_unit_has_a_floor() -> None:
    units = {unit(n) for n in modules()}
    missing = sorted(units - set(FLOORS) - ENTRY)
    assert not missing, f"units with no entry in FLOORS (say what each may import): {missing}"
    assert not (set(FLOORS) - units), f"FLOORS names units that no longer exist: {sorted(set(FLOORS) - units)}"


def _upward() -> dict[tuple[str, str], Import]:
    found: dict[tuple[str, str], Import] = {}
    for i in imports():
        a, b = unit(i.importer), unit(i.imported)
        if a == b or a in ENTRY:
            continue
        if b not in FLOORS.get(a, frozenset()):
            found.setdefault((i.importer, i.imported), i)
    return found


def test_no_upward_imports() -> None:
    upward = _upward()
    new = [f"{_relative(i.importer)}:{i.line} imports {i.imported} ({unit(i.importer)} may import "
           f"{sorted(FLOORS.get(unit(i.importer), ()))})" for key, i in sorted(upward.items()) if key not in KNOWN_UPWARD]
    assert not new, "upward imports:\n" + "\n".join(new)
    fixed = sorted(set(KNOWN_UPWARD) - set(upward))
    assert not fixed, f"KNOWN_UPWARD entries whose import is gone (remove them): {fixed}"


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    """``path`` is one of ``patterns``, under one ending in ``/``, or the module or package one names without ``.py``."""
    return any(path == p or (p.endswith("/") and path.startswith(p))
               or (not p.endswith((".py", "/")) and (path == p + ".py" or path.startswith(p + "/"))) for p in patterns)


def _torch_imports(name: str) -> list[Import]:
    return [i for i in all_imports(name) if i.imported.split(".")[0] == "torch" and not i.type_only]


def test_torch_free_floors_import_no_torch_at_module_level() -> None:
    bad = []
    for name in modules():
        path = _relative(name)
        if _matches(path, TORCH_FREE_AT_IMPORT) or (_matches(path, NO_TORCH) and path not in NO_TORCH_EXCEPT):
            bad += [f"{path}:{i.line}" for i in _torch_imports(name) if not i.lazy]
    assert not bad, f"torch imported at module level below its floor (docs/architecture.md, Import floors): {bad}"


def test_torch_free_tools_never_import_torch() -> None:
    bad = []
    for name in modules():
        path = _relative(name)
        if _matches(path, NO_TORCH) and path not in NO_TORCH_EXCEPT:
            allowed = {key.rpartition(":")[2] for key in NO_TORCH_EXCEPT if ":" in key
                       and _matches(path, (key.rpartition(":")[0],))}
            bad += [f"{path}:{i.line}" for i in _torch_imports(name) if i.function not in allowed]
    assert not bad, f"the torch-free tools import torch (docs/architecture.md, Import floors): {bad}"


@pytest.mark.parametrize("path", sorted(LONG_MODULES))
def test_long_module_entries_are_current(path: str) -> None:
    file = ROOT / path
    assert file.exists(), f"LONG_MODULES names {path}, which no longer exists: remove the entry"
    lines = len(file.read_text(encoding="utf-8").splitlines())
    assert lines > MAX_LINES, f"{path} has {lines} lines now: remove its LONG_MODULES entry"
    assert LONG_MODULES[path].strip(), f"{path}: say why it is long"


def test_no_module_over_the_limit_without_a_reason() -> None:
    long = {}
    for name, file in modules().items():
        lines = len(file.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and _relative(name) not in LONG_MODULES:
            long[_relative(name)] = lines
    assert not long, f"modules over {MAX_LINES} lines (split by concept, or give the reason in LONG_MODULES): {long}"


def test_a_folder_of_more_than_fifteen_modules_has_wings() -> None:
    counts: dict[str, int] = {}
    for file in modules().values():
        if file.name not in ("__init__.py", "__main__.py"):
            folder = file.parent.relative_to(ROOT).as_posix()
            counts[folder] = counts.get(folder, 0) + 1
    crowded = {folder: n for folder, n in counts.items() if n > MAX_FOLDER_MODULES and folder not in CROWDED_FOLDERS}
    assert not crowded, f"folders over {MAX_FOLDER_MODULES} modules (give them subpackages by concept): {crowded}"


def _module_word(file: Path) -> str:
    return file.parent.name if file.name == "__init__.py" else file.stem


def test_every_module_is_named_in_its_package_docstring() -> None:
    missing = []
    for file in modules().values():
        if file.name in ("__init__.py", "__main__.py") or file.parent == PACKAGE:
            continue
        doc = ast.get_docstring(ast.parse((file.parent / "__init__.py").read_text(encoding="utf-8"))) or ""
        if f".{file.stem}`" not in doc and f"{file.stem}.py" not in doc:
            missing.append(file.relative_to(ROOT).as_posix())
    assert not missing, f"modules their package's docstring does not name (:mod:`.name`): {missing}"


def test_every_module_is_on_the_architecture_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for file in modules().values():
        if file.name == "__main__.py":
            continue
        word = f"{file.parent.name}/" if file.name == "__init__.py" else file.name
        if file.name == "__init__.py" and file.parent == PACKAGE:
            continue
        if word not in text:
            missing.append(file.relative_to(ROOT).as_posix())
    assert not missing, f"modules docs/architecture.md's map does not name: {missing}"


LAUNCH_BASE = frozenset({"errors", "signals", "hints", "cpplog", "__init__"})
"""launch/'s modules at its top that every wing may use: its errors, signals, hints and torch's C++
log level (``__init__``: the package itself, its docstring's map)."""
LAUNCH_WINGS = ("torchrun", "setup", "nodes", "hangs", "procs")
"""launch/'s wings, lowest first: the torchrun command line, the job's set-up, the nodes' control
plane, hang watching, the processes. Each may import the wings below it; ``cli``, ``api`` and
``features`` at the top may import any."""


def _launch_part(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def test_launch_wings_import_only_the_wings_below() -> None:
    wrong = []
    for i in imports():
        if not (i.importer.startswith("npu_migrate.launch.") and i.imported.startswith("npu_migrate.launch")):
            continue
        a, b = _launch_part(i.importer), _launch_part(i.imported)
        if a == b or b in LAUNCH_BASE:
            if a in LAUNCH_BASE and b not in LAUNCH_BASE:
                wrong.append(f"{_relative(i.importer)}:{i.line} imports {i.imported}")
            continue
        if a in LAUNCH_BASE or (a in LAUNCH_WINGS and (b not in LAUNCH_WINGS
                                                       or LAUNCH_WINGS.index(b) > LAUNCH_WINGS.index(a))):
            wrong.append(f"{_relative(i.importer)}:{i.line} imports {i.imported}")
    assert not wrong, f"launch/'s wings import only the wings below them ({' < '.join(LAUNCH_WINGS)}) and " \
                      f"{sorted(LAUNCH_BASE)}:\n" + "\n".join(wrong)
