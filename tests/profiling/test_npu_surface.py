"""The NPU side of ``--profile`` against the released wheels: the calls npu_migrate makes on
``torch_npu.profiler``, and the stand-in's ``torch_npu.profiler`` (tests/fake_npu/torch_npu/profiler.py).

Read with :mod:`npu_migrate.releases.surface` from the wheels in ``NPU_MIGRATE_RELEASES_DIR`` (the
releases tests/fake_npu/NOT_SIMULATED.txt names; nothing is downloaded: a missing wheel skips, or
fails under CI):

* every name :mod:`npu_migrate.profile.recorder` reaches on ``torch_npu.profiler`` exists in every
  release, a class member (``ProfilerLevel.Level1``) included, and every keyword it passes is a
  parameter of that release's signature;
* the stand-in has the newest release's public names, the same class members, and its signatures
  (names, kinds, literal defaults), so code that runs on it calls the real profiler as it would.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, ROOT, child_env, released_wheel

from npu_migrate.releases import surface

MODULE = "torch_npu.profiler"
RECORDER = ROOT / "npu_migrate" / "profile" / "recorder.py"
ALIASES = {"tp", "p"}  # the names recorder.py binds torch_npu.profiler to
NOT_SIMULATED = FAKE_NPU / "NOT_SIMULATED.txt"


def compared_versions() -> list[str]:
    return [line[len("[torch-npu "):].split("]")[0] for line in NOT_SIMULATED.read_text().splitlines()
            if line.startswith("[torch-npu ")]


def newest() -> str:
    from packaging.version import Version

    return max(compared_versions(), key=Version)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def recorder_uses() -> tuple[set[str], dict[str, set[str]]]:
    """Names recorder.py reaches on torch_npu.profiler, and the keywords of each call it makes."""
    tree = ast.parse(RECORDER.read_text(encoding="utf-8"))
    names: set[str] = set()
    keywords: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == MODULE:
            names.update(alias.name for alias in node.names)
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            head, _, rest = (dotted or "").partition(".")
            if head in ALIASES and rest:
                names.add(rest)
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func) or ""
            head, _, rest = dotted.partition(".")
            if head in ALIASES and rest:
                keywords.setdefault(rest, set()).update(k.arg for k in node.keywords if k.arg)
    # a member's parent is reached too (ExportType.Text needs ExportType)
    names |= {n.rsplit(".", 1)[0] for n in names if "." in n}
    return names, keywords


def class_members(rel, name: str) -> set[str] | None:
    """The names a class of the release assigns in its body (``Level1 = Constant.LEVEL1``); None for a C class."""
    entry = surface.resolve(rel, name, MODULE)
    if entry.kind is not surface.Kind.CLASS:
        return None
    path = entry.module.replace(".", "/") + ".py"
    if path not in set(rel.names()):
        path = entry.module.replace(".", "/") + "/__init__.py"
    tree = ast.parse(rel.read_text(path))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name.rsplit(".", 1)[-1]:
            return {t.id for stmt in node.body if isinstance(stmt, ast.Assign) for t in stmt.targets
                    if isinstance(t, ast.Name)}
    return None


def reaches(rel, name: str) -> bool:
    """Whether ``torch_npu.profiler.<name>`` exists in the release (a class member assigned in its body too)."""
    head, _, member = name.partition(".")
    entry = surface.resolve(rel, head, MODULE)
    if entry.kind is surface.Kind.UNDEFINED:
        return False
    if not member:
        return head in surface.public_names(rel, MODULE) or entry.kind is not surface.Kind.NATIVE
    if entry.kind is surface.Kind.NATIVE:  # ProfilerActivity.CPU/.NPU: a C enum, read from torch_npu._C
        return head == "ProfilerActivity" and member in ("CPU", "NPU")
    members = class_members(rel, head) or set()
    return member in members or surface.resolve(rel, name, MODULE).kind is not surface.Kind.UNDEFINED


def test_the_recorder_uses_what_it_should() -> None:
    names, keywords = recorder_uses()
    assert {"profile", "tensorboard_trace_handler", "_ExperimentalConfig", "ProfilerActivity.NPU",
            "ProfilerAction", "ProfilerLevel.Level1"} <= names, names
    assert {"activities", "schedule", "on_trace_ready", "experimental_config"} <= keywords["profile"]


@pytest.mark.parametrize("version", compared_versions())
def test_every_call_of_the_recorder_is_the_release_one(version: str) -> None:
    rel = released_wheel(version)
    names, keywords = recorder_uses()
    missing = sorted(n for n in names if not reaches(rel, n))
    assert not missing, f"torch-npu {version}'s torch_npu.profiler lacks {missing}, which npu_migrate/profile uses"
    for name, passed in keywords.items():
        entry = surface.resolve(rel, name, MODULE)
        accepted = {p.name for p in entry.parameters or ()}
        assert entry.parameters is not None and passed <= accepted, (
            f"torch-npu {version}: {name}{entry.signature()} does not take {sorted(passed - accepted)}")


_DUMP = """
import inspect, json, sys
import torch, torch_npu.profiler as tp
from npu_migrate.releases.surface import parameters_of
out = {"public": sorted(tp.__all__), "signatures": {}, "members": {}}
for name in json.loads(sys.argv[1]):
    found = parameters_of(getattr(tp, name))
    out["signatures"][name] = None if found is None else [[p.name, p.kind, p.default] for p in found]
for name in json.loads(sys.argv[2]):
    out["members"][name] = sorted(k for k in vars(getattr(tp, name)) if not k.startswith("_"))
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.fake_npu
def test_the_stand_in_profiler_is_the_newest_release_one() -> None:
    rel = released_wheel(newest())
    public = surface.public_names(rel, MODULE)
    functions = [n for n in public if surface.resolve(rel, n, MODULE).parameters is not None]
    classes = [n for n in public if class_members(rel, n)]
    result = subprocess.run([sys.executable, "-c", _DUMP, json.dumps(functions), json.dumps(classes)],
                            env=child_env(FAKE_NPU), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    live = json.loads(result.stdout)
    assert live["public"] == sorted(public)
    problems = []
    for name in functions:
        want = surface.resolve(rel, name, MODULE).parameters
        have = [surface.Parameter(*p) for p in live["signatures"][name] or []]
        if [(p.name, p.kind) for p in want] != [(p.name, p.kind) for p in have]:
            problems.append(f"{name}: stand-in {surface.format_parameters(tuple(have))}, torch-npu "
                            f"{surface.format_parameters(want)}")
            continue
        for a, b in zip(want, have):
            try:
                literal = ast.literal_eval(a.default) if a.default is not None else None
            except ValueError:
                continue  # Constant.LEVEL0 and kin: the value is the stand-in's own
            if a.default is not None and repr(literal) != b.default:
                problems.append(f"{name}: {a.name}'s default is {b.default} in the stand-in, {a.default} in torch-npu")
    for name in classes:
        if sorted(class_members(rel, name)) != live["members"][name]:
            problems.append(f"{name}: stand-in members {live['members'][name]}, torch-npu {sorted(class_members(rel, name))}")
    assert not problems, f"tests/fake_npu/torch_npu/profiler.py drifted from torch-npu {newest()}:\n" + "\n".join(problems)
