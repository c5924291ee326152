"""The simulated NPU checked against the real package: torch_npu.npu's names and signatures, per release.

The real wheels (the releases named by the sections of NOT_SIMULATED.txt: one for each torch line
the stand-in runs on, and 2.1.0.post17) are read in place with :mod:`npu_migrate.releases.surface`.
The stand-in simulates one release at a time, the one that pairs with the running torch (or
``FAKE_NPU_RELEASE``'s), from a table generated here from the wheels
(tests/fake_npu/torch_npu/releases.json: each release's declared torch and the signature of each
name npu.py defines, or its absence). Each release is checked against its own wheel: every name
that runtime migration (each ``torch.cuda`` name it sends to ``torch.npu``), the port tool's
output (port/targets.py) and the examples or npu_migrate itself reach on the device module must
exist in the stand-in with that release's signature, a name the release lacks must be missing, and
every other real name is listed as not simulated, in a file this test keeps in sync. Regenerate
the table and the list (adding releases, if named) with::

    NPU_MIGRATE_RELEASES_DIR=DIR python tests/test_fake_npu_surface.py --write [VERSION ...]

Wheels come from ``NPU_MIGRATE_RELEASES_DIR`` (.ci/run keeps them in .ci-cache and fetches every
release NOT_SIMULATED.txt names); nothing is downloaded here. A missing wheel fails the test under
CI (``CI=true``) and skips it elsewhere.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Optional

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []

from npu_migrate import releases  # noqa: E402
from npu_migrate.releases import pairs, surface  # noqa: E402

from conftest import fake_npu_release_table, released_wheel  # noqa: E402

FAKE_NPU = TESTS / "fake_npu"
NOT_SIMULATED = FAKE_NPU / "NOT_SIMULATED.txt"


release_table = fake_npu_release_table()
TABLE = release_table.TABLE
REGENERATE = release_table.REGENERATE
STAND_IN = releases.Release("stand-in", FAKE_NPU, "installed")
# Public names of the stand-in that the real torch.npu does not have, and why they may stay.
STAND_IN_ONLY = {"NpuTensor": "the simulated devices' tensor type, which tests inspect"}
SOURCES = (ROOT / "npu_migrate", ROOT / "examples")


def compared_versions() -> list[str]:
    """The releases compared (and simulated): the sections of NOT_SIMULATED.txt."""
    return [line[len("[torch-npu "):].split("]")[0] for line in NOT_SIMULATED.read_text().splitlines()
            if line.startswith("[torch-npu ")]


def newest_first(versions: Iterable[str]) -> list[str]:
    from packaging.version import Version

    return sorted(versions, key=Version, reverse=True)


def release(version: str) -> releases.Release:
    """The cached (or installed) wheel of ``version``; fail under CI, skip elsewhere, when missing."""
    return released_wheel(version)


# --------------------------------------------------------------------------- what the code uses

_DEVICE_MODULE_CALLS = frozenset({"_module", "_accelerator_module", "get_device_module"})


def _device_path(node: ast.AST, bound: dict[str, str]) -> Optional[str]:
    """``""`` when ``node`` is a device module (``getattr(torch, spec.name)``, ``_module(spec)``,
    ``torch.npu``), ``"mstx.mark"`` when it is an attribute path below one, else ``None``."""
    if isinstance(node, ast.IfExp):
        for branch in (node.body, node.orelse):
            found = _device_path(branch, bound)
            if found is not None:
                return found
        return None
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr == "npu":
            return ""
        base = _device_path(node.value, bound)
        return None if base is None else f"{base}.{node.attr}".lstrip(".")
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in _DEVICE_MODULE_CALLS:
            return ""
        if name == "getattr" and len(node.args) >= 2:
            owner, attr = node.args[0], node.args[1]
            if isinstance(owner, ast.Name) and owner.id == "torch":
                literal = isinstance(attr, ast.Constant)
                return "" if not literal or attr.value == "npu" else None
            base = _device_path(owner, bound)
            if base is not None and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                return f"{base}.{attr.value}".lstrip(".")
    return None


def _own_nodes(scope: ast.AST) -> Iterable[ast.AST]:
    """The nodes of one scope, without the bodies of functions and classes nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def device_module_uses(tree: ast.AST) -> set[str]:
    """Names reached on the device module in ``tree``: ``module.X``, ``getattr(module, "X")``,
    ``hasattr(module, "X")``, through local names, enclosing scopes and arguments passed to a
    function of the same module (``nvtx_functions(mstx)`` makes its ``mstx`` parameter one)."""
    found: set[str] = set()
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    parameters: dict[str, dict[str, str]] = {}

    def visit(scope: ast.AST, inherited: dict[str, str]) -> None:
        bound = {**inherited, **parameters.get(getattr(scope, "name", ""), {})}
        nodes = list(_own_nodes(scope))
        for _ in range(3):  # names bound from names bound before them
            for node in nodes:
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                    path = _device_path(node.value, bound)
                    for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        if path is not None and isinstance(target, ast.Name):
                            bound[target.id] = path
        for node in nodes:
            if isinstance(node, (ast.Attribute, ast.Call)):
                path = _device_path(node, bound)
                if path:
                    found.add(path)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id == "hasattr" and len(node.args) == 2 and isinstance(node.args[1], ast.Constant):
                    base = _device_path(node.args[0], bound)
                    if base is not None:
                        found.add(f"{base}.{node.args[1].value}".lstrip("."))
                callee = functions.get(node.func.id)
                if callee is not None:
                    names = [a.arg for a in callee.args.posonlyargs + callee.args.args]
                    for name, arg in zip(names, node.args):
                        path = _device_path(arg, bound)
                        if path is not None:
                            parameters.setdefault(callee.name, {})[name] = path
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(node, bound)

    for _ in range(2):  # a second pass sees the parameters bound by calls further down
        visit(tree, {})
    return found


@functools.lru_cache(maxsize=None)
def used_names() -> dict[str, set[str]]:
    """Device-module names used, by where: runtime migration, the port's output, the code."""
    from npu_migrate.migrate.patches import cuda_namespace
    from npu_migrate.port import targets

    code: set[str] = set()
    for base in SOURCES:
        for path in sorted(base.rglob("*.py")):
            code |= device_module_uses(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    port: set[str] = set()
    for target in targets.TARGETS.values():
        for style in targets.STYLES:
            template = target.template(style)
            if template:
                port |= device_module_uses(ast.parse(template.replace("**ARGS", "**kwargs"), mode="eval"))
    for name in targets.HELPERS:
        for style in targets.STYLES:
            port |= device_module_uses(ast.parse(targets.helper_source(name, style)))
    return {"runtime migration": set(cuda_namespace.redirected_to_device_module()),
            "port output": port, "npu_migrate and examples": code}


def required(entries: dict[str, surface.Entry], used: dict[str, set[str]]) -> dict[str, str]:
    """The release's names the stand-in must have, each with the first user that needs it."""
    out: dict[str, str] = {}
    for who, names in used.items():
        for name in sorted(names):
            head = name.split(".")[0]
            if name in entries or (head in entries and entries[head].kind is not surface.Kind.UNDEFINED):
                out.setdefault(name, who)
    return out


def read_release(rel: releases.Release, used: dict[str, set[str]]) -> dict[str, surface.Entry]:
    dotted = sorted({n for names in used.values() for n in names if "." in n})
    entries = surface.read(rel, extra=tuple(dotted))
    return {k: v for k, v in entries.items() if v.kind is not surface.Kind.UNDEFINED or "." not in k}


# --------------------------------------------------------------------------- the generated list


def render(versions: list[str]) -> str:
    """NOT_SIMULATED.txt for ``versions``: per release, each real public name the stand-in lacks."""
    simulated = set(surface.defined_names(STAND_IN))
    lines = [
        "# torch_npu.npu (torch.npu) names of real torch-npu releases that tests/fake_npu does not simulate.",
        "# Read from the wheels' torch_npu/npu/__init__.py (__all__) and followed to their definitions.",
        f"# Generated by tests/test_fake_npu_surface.py, which fails when it is out of date; regenerate with:",
        f"#   {REGENERATE}",
        "# name  kind  signature (or why there is none)  module",
    ]
    for version in versions:
        rel = releases.find(version, allow_download=False)
        names = surface.public_names(rel)
        entries = surface.read(rel)
        missing = [n for n in names if n not in simulated]
        lines += ["", f"[torch-npu {version}] {len(names)} public names, {len(names) - len(missing)} simulated, "
                      f"{len(missing)} not simulated"]
        for name in missing:
            entry = entries[name]
            lines.append(f"{name}  {entry.kind.value}  {entry.signature() or entry.note or '-'}  {entry.module}")
    return "\n".join(lines) + "\n"


def declared_torch(rel: releases.Release) -> str:
    """The torch version the release's METADATA pins, without a local label (``torch==2.7.1+cpu``
    -> ``2.7.1``); its release line (``2.7``) where the requirement pins no one version."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    specs = list(Requirement(rel.requires_torch).specifier) if rel.requires_torch else []
    if len(specs) == 1 and specs[0].operator == "==":
        return Version(specs[0].version.removesuffix(".*")).public
    return ".".join(map(str, pairs.built_for(rel.requires_torch, rel.version)))


def stand_in_names() -> list[str]:
    """The torch.npu names npu.py defines that a release may have (NpuTensor is the stand-in's own)."""
    return [n for n in surface.defined_names(STAND_IN) if n not in STAND_IN_ONLY]


def release_has(rel: releases.Release, public: set[str], name: str) -> bool:
    """Whether ``torch.npu.<name>`` exists in the release: in its ``__all__``, or a submodule (amp)."""
    return name in public or surface.resolve(rel, name).kind is surface.Kind.MODULE


def render_table(versions: list[str]) -> str:
    """releases.json for ``versions``: per release (newest first), the torch its METADATA declares,
    the signature of each name npu.py defines (``null``: none in Python), and the names it lacks."""
    names = stand_in_names()
    records = []
    for version in newest_first(versions):
        rel = releases.find(version, allow_download=False)
        public, entries = set(surface.public_names(rel)), surface.read(rel)
        signatures = {n: (entries[n] if n in entries else surface.resolve(rel, n)).signature()
                      for n in names if release_has(rel, public, n)}
        records.append({"version": rel.version, "requires_torch": rel.requires_torch, "torch": declared_torch(rel),
                        "absent": [n for n in names if n not in signatures], "signatures": signatures})
    about = ("torch_npu.npu (torch.npu) of each torch-npu release the stand-in simulates: the torch its METADATA "
             "declares, the signature of each name tests/fake_npu/torch_npu/npu.py defines (null: no Python "
             "signature) and the names the release lacks. Read from the released wheels by "
             f"tests/test_fake_npu_surface.py, which fails when this file is out of date; regenerate with: {REGENERATE}")
    return json.dumps({"about": about, "releases": records}, indent=1) + "\n"


def write(added: list[str]) -> None:
    """Regenerate NOT_SIMULATED.txt and releases.json for the compared releases and ``added``."""
    versions = newest_first(set(compared_versions()) | set(added))[::-1]
    NOT_SIMULATED.write_text(render(versions))
    TABLE.write_text(render_table(versions))


# --------------------------------------------------------------------------- the checks


def drift(entries: dict[str, surface.Entry], names: Iterable[str],
          live: dict[str, Optional[list[list[Optional[str]]]]]) -> list[str]:
    """Where the stand-in's ``live`` signatures differ from the release's, one line each."""
    problems = []
    for name in sorted(names):
        entry = entries.get(name)
        if name not in live:
            problems.append(f"{name}: missing from the stand-in (the release has it: {entry.signature() if entry else '?'})")
            continue
        if entry is None or entry.parameters is None or live[name] is None:
            continue
        have = tuple(surface.Parameter(*p) for p in live[name])
        if not surface.same_parameters(entry.parameters, have):
            problems.append(f"{name}: the stand-in has {surface.format_parameters(have)}, torch-npu has "
                            f"{entry.signature()} ({entry.module})")
    return problems


@pytest.mark.parametrize("version", compared_versions())
def test_the_release_surface_is_read_from_the_wheel(version: str) -> None:
    rel = release(version)
    entries = surface.read(rel)
    assert len(entries) == len(surface.public_names(rel)) > 100
    assert [n for n, e in entries.items() if e.kind is surface.Kind.UNDEFINED] == []
    assert entries["set_device"].signature() == "(device)" and entries["set_device"].module == "torch_npu.npu.utils"
    assert entries["FloatTensor"].kind is surface.Kind.NATIVE  # created by torch_npu._C: no Python signature


@pytest.mark.slow
def test_not_simulated_list_is_in_sync() -> None:
    versions = compared_versions()
    for version in versions:
        release(version)
    assert render(versions) == NOT_SIMULATED.read_text(), f"{NOT_SIMULATED} is out of date: run {REGENERATE}"


@pytest.mark.slow
@pytest.mark.parametrize("version", compared_versions())
def test_every_name_in_use_is_simulated(version: str) -> None:
    used = used_names()
    assert {"set_device", "device_count", "Stream"} <= used["port output"]
    assert {"mstx.mark", "amp.GradScaler", "get_rng_state"} <= used["npu_migrate and examples"]
    entries = read_release(release(version), used)
    need = required(entries, used)
    simulated = set(surface.defined_names(STAND_IN))
    missing = [f"{n} (used by {who})" for n, who in need.items() if n.split(".")[0] not in simulated]
    assert not missing, f"names torch-npu {version} has and npu_migrate uses, missing from tests/fake_npu: {missing}"


@pytest.mark.parametrize("version", compared_versions())
def test_the_hf32_switches_the_probe_reads_are_the_release_ones(version: str) -> None:
    """The probe notes HF32 steps from ``torch.npu.conv.allow_hf32`` and ``torch.npu.matmul.allow_hf32``."""
    from npu_migrate.compare.recording.stats import HF32_SWITCHES

    rel = release(version)
    tree = ast.parse(rel.read_text("torch_npu/npu/__init__.py"))
    assigned = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    config = rel.read_text("torch_npu/npu/npu_config.py")
    for name in HF32_SWITCHES:
        value = assigned.get(name)
        assert isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute), (version, name)
        assert f"class {value.func.attr}" in config, (version, name, value.func.attr)
    assert config.count('if name == "allow_hf32"') >= 2 * len(HF32_SWITCHES), version  # each one's getter and setter


_DUMP = """
import inspect, json, sys, torch, torch_npu
names = json.loads(sys.argv[1])
version = torch_npu.__version__
def params(obj):
    from npu_migrate.releases.surface import parameters_of
    found = parameters_of(obj)
    return None if found is None else [[p.name, p.kind, p.default] for p in found]
def own(name):  # not an imported module or typing helper
    obj = getattr(torch.npu, name)
    if inspect.ismodule(obj):
        return obj.__name__.startswith("torch_npu.")
    return getattr(obj, "__module__", None) not in ("typing", "typing_extensions", "__future__")
out, public = {}, sorted(n for n in dir(torch.npu) if not n.startswith("_") and own(n))
for name in names:
    obj = torch.npu
    try:
        for part in name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        continue
    out[name] = params(obj)
print(json.dumps({"version": version, "public": public, "signatures": out}))
"""


def live_surface(version: Optional[str], names: list[str]) -> dict:
    """torch.npu as a child process sees it with the stand-in, simulating ``version`` (else the
    release that pairs with this torch): its release, public names and the signatures of ``names``."""
    from conftest import child_env

    extra = {release_table.ENV: version} if version else {}
    result = subprocess.run([sys.executable, "-c", _DUMP, json.dumps(names)], env=child_env(FAKE_NPU, **extra),
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
@pytest.mark.fake_npu
@pytest.mark.parametrize("version", compared_versions())
def test_stand_in_signatures_are_the_release_ones(version: str) -> None:
    """torch.npu with the stand-in simulating ``version``, against that release's wheel: the names
    npu.py defines that the release has, and only those, each with the release's signature."""
    rel = release(version)
    used = used_names()
    entries = read_release(rel, used)
    public = set(surface.public_names(rel))
    simulated = surface.defined_names(STAND_IN)
    need = required(entries, used)
    asked = sorted(set(simulated) | set(need))
    live = live_surface(version, asked)
    assert live["version"] == rel.version
    expected = sorted(n for n in simulated if n in STAND_IN_ONLY or release_has(rel, public, n))
    extra = sorted(set(live["public"]) - set(expected))
    lacking = sorted(set(expected) - set(live["public"]))
    assert not extra, (f"the stand-in has names torch-npu {version} lacks (runtime migration would send "
                       f"torch.cuda's there in tests only): {extra}; regenerate with {REGENERATE}")
    assert not lacking, f"torch.npu's public names lack {lacking}, which npu.py defines and torch-npu {version} has"
    checked = [n for n in asked if n in entries]
    problems = drift(entries, checked, live["signatures"])
    assert not problems, f"tests/fake_npu drifted from torch-npu {version}:\n" + "\n".join(problems)


@pytest.mark.slow
@pytest.mark.fake_npu
def test_the_stand_in_simulates_the_release_that_pairs_with_this_torch() -> None:
    import torch

    candidates = [release(v) for v in newest_first(compared_versions())]
    public = torch.__version__.split("+")[0]
    rel = (pairs.pairing(torch.__version__, candidates) or next((r for r in candidates if declared_torch(r) == public), None)
           or pairs.same_line(torch.__version__, candidates))
    assert rel is not None, (f"no compared torch-npu release is built for torch {torch.__version__}: add the one "
                             f"that pairs with it: {REGENERATE}")
    assert live_surface(None, [])["version"] == rel.version


_ATTEMPTS = """
import sys, torch
def attempt(call):
    try:
        return repr(call())
    except TypeError as exc:
        return f"TypeError: {exc}"
print(attempt(lambda: torch.npu.is_bf16_supported(including_emulation=True)))
print(attempt(lambda: torch.npu.is_bf16_supported(True)))
print(hasattr(torch.npu, sys.argv[1]))
"""


@pytest.mark.slow
@pytest.mark.fake_npu
def test_a_call_the_simulated_release_refuses_raises_type_error() -> None:
    """Code written for one release fails on the stand-in simulating another as on the real one:
    ``is_bf16_supported(including_emulation=...)`` where the release's takes no argument, a name the
    release lacks. Which release has what is read from the wheels."""
    from conftest import child_env

    versions = newest_first(compared_versions())
    takes = {v: [p.name for p in surface.resolve(release(v), "is_bf16_supported").parameters] for v in versions}
    new = next(v for v in versions if takes[v] == ["including_emulation"])
    old = next(v for v in reversed(versions) if takes[v] == [])
    new_public, old_public = set(surface.public_names(release(new))), set(surface.public_names(release(old)))
    added = [n for n in stand_in_names() if release_has(release(new), new_public, n)
             and not release_has(release(old), old_public, n)]
    assert added, f"npu.py defines no name that torch-npu {new} has and {old} lacks"
    seen = {}
    for version in (old, new):
        result = subprocess.run([sys.executable, "-c", _ATTEMPTS, added[0]], capture_output=True, text=True,
                                env=child_env(FAKE_NPU, **{release_table.ENV: version}), timeout=120, cwd=ROOT)
        assert result.returncode == 0, result.stderr
        seen[version] = result.stdout.splitlines()
    assert seen[old] == ["TypeError: is_bf16_supported() got an unexpected keyword argument 'including_emulation'",
                         "TypeError: is_bf16_supported() takes 0 positional arguments but 1 was given", "False"]
    assert seen[new] == ["True", "True", "True"]


def test_each_torch_gets_the_release_built_for_it() -> None:
    """The table's releases are the compared ones; the stand-in picks, for a torch, the release
    whose METADATA declares it (any build of it), else the newest one of its release line."""
    candidates = [release(v) for v in newest_first(compared_versions())]
    table = release_table.load()
    assert [r.version for r in table] == [r.version for r in candidates], f"{TABLE} is out of date: run {REGENERATE}"
    for rel in candidates:
        declared = declared_torch(rel)
        for build in (declared, f"{declared}+cpu", f"{declared}+cu130"):
            chosen = release_table.pick(build, table).version
            assert chosen == rel.version, f"torch {build} gets {chosen}, not {rel.version}: two releases declare it"
    for line in sorted({pairs.release_of(declared_torch(r)) for r in candidates}):
        unreleased = ".".join(map(str, line)) + ".99"  # a patch release no torch-npu declares
        assert release_table.pick(unreleased, table).version == pairs.same_line(unreleased, candidates).version
    with pytest.raises(ImportError, match=r"simulates no torch-npu release built for torch 1\.0\.0 \(its table has "):
        release_table.pick("1.0.0", table)
    oldest, newest = candidates[-1], candidates[0]
    assert release_table.pick(declared_torch(newest), table, oldest.version).version == oldest.version
    with pytest.raises(ImportError, match=r"^FAKE_NPU_RELEASE=0\.0: the torch_npu stand-in simulates torch-npu "):
        release_table.pick(declared_torch(newest), table, "0.0")


@pytest.mark.slow
def test_the_release_table_is_generated_from_the_wheels() -> None:
    versions = compared_versions()
    for version in versions:
        release(version)
    assert render_table(versions) == TABLE.read_text(), f"{TABLE} is out of date: run {REGENERATE}"


def test_a_changed_signature_is_drift() -> None:
    entry = surface.Entry("set_rng_state", surface.Kind.FUNCTION, "torch_npu.npu.random",
                          (surface.Parameter("new_state", "POSITIONAL_OR_KEYWORD"),
                           surface.Parameter("device", "POSITIONAL_OR_KEYWORD", "'npu'")))
    same = [["new_state", "POSITIONAL_OR_KEYWORD", None], ["device", "POSITIONAL_OR_KEYWORD", "'npu'"]]
    renamed = [["state", "POSITIONAL_OR_KEYWORD", None], ["device", "POSITIONAL_OR_KEYWORD", "'npu'"]]
    other_default = [["new_state", "POSITIONAL_OR_KEYWORD", None], ["device", "POSITIONAL_OR_KEYWORD", "None"]]
    entries = {"set_rng_state": entry}
    assert drift(entries, ["set_rng_state"], {"set_rng_state": same}) == []
    assert drift(entries, ["set_rng_state"], {"set_rng_state": renamed}) == [
        "set_rng_state: the stand-in has (state, device='npu'), torch-npu has (new_state, device='npu') "
        "(torch_npu.npu.random)"]
    assert drift(entries, ["set_rng_state"], {"set_rng_state": other_default})
    assert drift(entries, ["set_rng_state"], {}) == [
        "set_rng_state: missing from the stand-in (the release has it: (new_state, device='npu'))"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        write(sys.argv[2:])
        print(f"wrote {NOT_SIMULATED} and {TABLE}: torch-npu {', '.join(compared_versions())}")
    else:
        print(__doc__)
