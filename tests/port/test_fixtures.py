"""Every fixture pair under fixtures/ ports as expected, reports what its comments expect, is stable, and runs.

A fixture is ``NMxxx_<case>.in.py`` with its expected port ``NMxxx_<case>.out.py``; pairs are found by
glob. A line ending in ``# expect: NMxxx`` must produce that finding (and no line may produce one it
does not expect). ``NMxxx_noop`` cases are look-alikes whose ``.out.py`` equals the ``.in.py``;
``NMxxx_<case>_reported`` cases are reported instead of rewritten.
Every ``.out.py`` is executed on the CPU tier (in this process) and on the simulated-NPU tier (one
child process with tests/fake_npu first on the path); ``--style torch`` ports of every ``.in.py``
are executed too where torch has ``torch.accelerator``. See fixture_runner.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, HIDDEN_DEVICES, child_env
from port.marks import torch_style_runs
from npu_migrate.port import port_source
from npu_migrate.port.rules import RULES

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_runner  # noqa: E402 - the runner is also a script, so it is not a package module

FIXTURES = Path(__file__).resolve().parent / "fixtures"
INPUTS = sorted(FIXTURES.glob("*.in.py"))


def _expected(src: Path) -> str:
    return src.with_name(src.name.replace(".in.py", ".out.py")).read_text()


def _expected_findings(text: str) -> set[tuple[int, str]]:
    return {(i, code) for i, line in enumerate(text.splitlines(), 1) for code in re.findall(r"expect: (NM\d+)", line)}


@pytest.mark.parametrize("src", INPUTS, ids=lambda p: p.name[:-6])
def test_fixture(src: Path) -> None:
    result = port_source(src.read_text())
    assert result.code == _expected(src)
    assert {(f.line, f.code) for f in result.findings} == _expected_findings(src.read_text())
    code = src.name[:5]
    if src.name.endswith("_noop.in.py"):
        assert not result.changes
    elif src.name.endswith("_reported.in.py"):  # looks like a rewrite, but only a human can tell
        assert not result.changes and result.findings
    elif code.startswith("NM0"):
        assert result.changes and {c.code for c in result.changes} >= {code}


@pytest.mark.parametrize("src", INPUTS, ids=lambda p: p.name[:-6])
def test_fixture_is_idempotent(src: Path) -> None:
    out = _expected(src)
    again = port_source(out)
    assert again.code == out
    assert not again.changes


@pytest.mark.parametrize("src", INPUTS, ids=lambda p: p.name[:-6])
def test_fixture_torch_style_is_idempotent(src: Path) -> None:
    ported = port_source(src.read_text(), style="torch").code
    assert "import npu_migrate" not in ported
    assert port_source(ported, style="torch").code == ported


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_every_rule_has_a_positive_and_a_noop_fixture(rule) -> None:
    names = {p.name for p in INPUTS if p.name.startswith(rule.code + "_")}
    assert f"{rule.code}_noop.in.py" in names, f"{rule.code} has no look-alike fixture"
    assert len(names) >= 2, f"{rule.code} has no positive fixture"
    for name in names:
        assert (FIXTURES / name.replace(".in.py", ".out.py")).exists(), f"{name} has no .out.py"


# --------------------------------------------------------------------------- ported fixtures run

OUTPUTS = sorted(FIXTURES.glob("*.out.py"))


def _check(result: dict[str, str], name: str) -> None:
    if result["status"] == "skipped":
        pytest.skip(result["error"])
    assert result["status"] in ("ok", "raised"), f"{name} failed when executed:\n{result['error']}"


@pytest.mark.parametrize("out", OUTPUTS, ids=lambda p: p.name[:-7])
def test_ported_fixture_runs_on_cpu(out: Path) -> None:
    """CPU tier: every .out.py is executed (snippets get stand-ins for the names they do not define)."""
    _check(fixture_runner.run_one(out.read_text(), str(out)), out.name)


@torch_style_runs
@pytest.mark.parametrize("src", INPUTS, ids=lambda p: p.name[:-6])
def test_torch_style_port_runs_on_cpu(src: Path) -> None:
    code = port_source(src.read_text(), style="torch").code
    _check(fixture_runner.run_one(code, str(src)), src.name)


@pytest.fixture(scope="module")
def npu_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Simulated-NPU tier: all .out.py fixtures executed in one child with the torch_npu stand-in."""
    out = tmp_path_factory.mktemp("npu") / "results.json"
    proc = subprocess.run(
        [sys.executable, str(Path(fixture_runner.__file__)), "npu_migrate", str(out), *map(str, OUTPUTS)],
        # The ported code runs without runtime migration: a GPU host's CUDA stays hidden here too.
        env=child_env(FAKE_NPU, **HIDDEN_DEVICES), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


# Failures of the torch_npu stand-in or the device layer, not of the port (for the lead to route):
# fixture -> (text of the error, why).
_NPU_TIER_GAPS = {
    "NM004_torch_cuda_api.out.py": ("DeviceAllocator", "nm.empty_cache() calls torch.accelerator.empty_cache(), "
                                    "which asserts on the stand-in's npu allocator (not a DeviceAllocator) with "
                                    "torch >= 2.8"),
    "NM011_generator.out.py": ("getNewGenerator", "the stand-in registers no PrivateUse1 generator hook, so "
                               "torch.Generator(device='npu:0') fails there"),
}


@pytest.mark.slow
@pytest.mark.fake_npu
@pytest.mark.parametrize("out", OUTPUTS, ids=lambda p: p.name[:-7])
def test_ported_fixture_runs_on_simulated_npu(out: Path, npu_results: dict[str, dict[str, str]]) -> None:
    marker, gap = _NPU_TIER_GAPS.get(out.name, ("", ""))
    if gap and npu_results[out.name]["status"] == "failed" and marker in npu_results[out.name]["error"]:
        pytest.xfail(gap)
    _check(npu_results[out.name], out.name)


@pytest.mark.slow
def test_simulated_npu_tier_really_selects_npu(tmp_path: Path) -> None:
    """The NPU tier's fixtures ran on npu: a ported device string becomes an npu device there."""
    probe = tmp_path / "probe.out.py"
    probe.write_text(port_source(
        'import torch\nx = torch.zeros(1).to("cuda")\nassert x.device.type == "npu", x.device\n').code)
    selected = subprocess.run([sys.executable, "-c", "import npu_migrate as nm; print(nm.device_type())"],
                              env=child_env(FAKE_NPU), capture_output=True, text=True, timeout=120).stdout.strip()
    if selected != "npu":
        pytest.skip(f"the torch_npu stand-in provides no npu device on torch {torch.__version__} "
                    f"(it needs torch._C._acc's PrivateUse1 hooks); the NPU tier runs on {selected} here")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(Path(fixture_runner.__file__)), "npu_migrate", str(out), str(probe)],
                          env=child_env(FAKE_NPU), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    _check(json.loads(out.read_text())["probe.out.py"], "probe")
