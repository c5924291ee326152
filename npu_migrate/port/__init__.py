"""Port CUDA-only PyTorch source to device-neutral source (``npu-migrate port`` / ``check``).

Usage::

    from npu_migrate.port import port_source

    result = port_source(open("train.py").read())            # import npu_migrate as nm
    result = port_source(source, style="torch")               # plain torch.accelerator code
    result = port_source(source, select=["NM001", "NM006"])   # only these rules
    print(result.code)
    for f in result.findings:
        print(f"{f.line}:{f.col} {f.code} {f.message} ({f.fix})")

Modules, each owning one concept (what each ``torch.cuda`` API becomes is :mod:`npu_migrate.cuda_api`):

* :mod:`.rules`: the rule table, one row per rule code;
* :mod:`.matchers`: the rules' matchers, one module per area;
* :mod:`.context`: the matcher API: what a rule sees (``Context``) and returns (``Hit``);
* :mod:`.targets`: how each device-neutral operation is spelled in each output style;
* :mod:`.torch_devices`: which torch calls take a device, the table NM011 reads (generated);
* :mod:`.transformer`: the libcst transformer that applies the rule table;
* :mod:`.finish`: after the rules: the name ``npu_migrate`` is bound as, helpers, imports added and dropped;
* :mod:`.positions`: where a change or finding is in the input (line and column);
* :mod:`.notebook`: Jupyter notebooks, their code cells ported as one module;
* :mod:`.report`: per file every change and finding, and totals (markdown and JSON);
* :mod:`.cli`: ``npu-migrate port`` and ``npu-migrate check``.

Only files in which the text prefilter (each rule's trigger patterns) finds a candidate are
parsed and get scope analysis; the others are only syntax-checked.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import libcst as cst

from npu_migrate.errors import NpuMigrateError
from npu_migrate.port.context import Rule
from npu_migrate.port.rules import DEFERRED, RULES, select_rules
from npu_migrate.port.targets import STYLES
from npu_migrate.port.transformer import Change, Finding, transform

__all__ = ["Change", "Finding", "PortResult", "PortSyntaxError", "RULES", "Rule", "port_source"]


class PortSyntaxError(NpuMigrateError, SyntaxError):
    """The source does not parse, so it cannot be ported (it is copied unchanged)."""

    def __init__(self, message: str, line: int = 1, col: int = 1) -> None:
        super().__init__(message)
        self.msg = message
        self.line = line
        self.col = col

    def __str__(self) -> str:
        return self.msg


@dataclass(frozen=True)
class PortResult:
    """What porting one source did.

    Attributes:
        source: the input.
        code: the ported source (the input itself when nothing changed).
        changes: every rewrite, with its rule and input position.
        findings: every site that needs a human, with the reason and a suggested fix.
        parsed: ``False`` when the source contains no text any rule looks for, so it was not parsed.
    """

    source: str
    code: str
    changes: tuple[Change, ...] = ()
    findings: tuple[Finding, ...] = ()
    parsed: bool = True

    @property
    def changed(self) -> bool:
        """Whether the ported source differs from the input."""
        return self.code != self.source


@functools.lru_cache(maxsize=64)
def _rules_for(select: Optional[tuple[str, ...]], ignore: Optional[tuple[str, ...]]) -> tuple[tuple[Rule, ...], re.Pattern[str]]:
    rules = select_rules(select, ignore)
    triggers = sorted({t for r in rules for t in r.triggers})
    return rules, re.compile("|".join(f"(?:{t})" for t in triggers) or "(?!)")


def _syntax_ok(source: str) -> bool:
    """A quick syntax check with the interpreter's own parser, for files no rule needs to read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<port>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _syntax_error(source: str, exc: cst.ParserSyntaxError) -> PortSyntaxError:
    """A one-line error; the interpreter's parser names the problem better where it agrees."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<port>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as py:
        line, col = py.lineno or 1, py.offset or 1
        return PortSyntaxError(f"line {line}, column {col}: {py.msg}", line, col)
    except ValueError:
        pass
    match = re.search(r"error at (\d+):(\d+): (.*)", exc.message)
    if match:
        line, col, detail = int(match.group(1)), int(match.group(2)) + 1, match.group(3)
    else:
        line, col, detail = exc.raw_line, exc.raw_column + 1, exc.message
    detail = " ".join(detail.split())
    return PortSyntaxError(f"line {line}, column {col}: {detail}", line, col)


def port_source(
    source: str,
    style: str = "npu_migrate",
    select: Optional[Sequence[str]] = None,
    ignore: Optional[Sequence[str]] = None,
    report_only: bool = False,
) -> PortResult:
    """Port one module's source.

    Args:
        source: Python source text.
        style: ``"npu_migrate"`` writes ``nm.*`` calls (``import npu_migrate as nm``); ``"torch"``
            writes plain ``torch.accelerator`` code with small helpers and no npu_migrate import.
        select: rule codes or prefixes to apply (all by default).
        ignore: rule codes or prefixes to leave out.
        report_only: rewrite nothing; report every site a rewrite rule would change as a finding
            (what ``npu-migrate check`` prints).

    Returns:
        The ported source with its changes and findings.

    Raises:
        PortSyntaxError: the source does not parse; the message has the line and column.
        ValueError: an unknown style or rule code; the message lists the valid ones.
    """
    if style not in STYLES:
        raise ValueError(f"Unknown style {style!r}. Expected one of: {', '.join(STYLES)}.")
    rules, triggers = _rules_for(tuple(select) if select else None, tuple(ignore) if ignore else None)
    if triggers.search(source) is None and _syntax_ok(source):
        return PortResult(source, source, parsed=False)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise _syntax_error(source, exc) from exc
    new, changes, findings, changed = transform(module, rules, style, report_only, DEFERRED, source)
    code = new.code if changed else source
    return PortResult(source, code, tuple(changes), tuple(findings))
