"""Every fixture pair under fixtures/ ports as expected, reports what its comments expect, and is stable.

A fixture is ``NMxxx_<case>.in.py`` with its expected port ``NMxxx_<case>.out.py``; pairs are found by
glob. A line ending in ``# expect: NMxxx`` must produce that finding (and no line may produce one it
does not expect). ``NMxxx_noop`` cases are look-alikes whose ``.out.py`` equals the ``.in.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npu_migrate.port import port_source
from npu_migrate.port.rules import RULES

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
    elif code.startswith("NM0"):
        assert result.changes and {c.code for c in result.changes} >= {code}


@pytest.mark.parametrize("src", INPUTS, ids=lambda p: p.name[:-6])
def test_fixture_is_idempotent(src: Path) -> None:
    out = _expected(src)
    again = port_source(out)
    assert again.code == out
    assert not again.changes


@pytest.mark.parametrize("src", INPUTS, ids=lambda p: p.name[:-6])
def test_fixture_torch_style_compiles_and_is_idempotent(src: Path) -> None:
    ported = port_source(src.read_text(), style="torch").code
    compile(ported, str(src), "exec")
    assert "npu_migrate" not in ported
    assert port_source(ported, style="torch").code == ported


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_every_rule_has_a_positive_and_a_noop_fixture(rule) -> None:
    names = {p.name for p in INPUTS if p.name.startswith(rule.code + "_")}
    assert f"{rule.code}_noop.in.py" in names, f"{rule.code} has no look-alike fixture"
    assert len(names) >= 2, f"{rule.code} has no positive fixture"
    for name in names:
        assert (FIXTURES / name.replace(".in.py", ".out.py")).exists(), f"{name} has no .out.py"
