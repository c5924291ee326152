"""Reports of a port run: per file every change and finding, and totals (markdown and JSON).

Usage::

    from npu_migrate.port.report import FileResult, to_json, to_markdown

    text = to_markdown(results, style="npu_migrate")   # for --report FILE.md
    data = to_json(results, style="npu_migrate")       # for --json FILE (json.dumps-able)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional, Sequence

from npu_migrate.port.rules import RULES, rule_by_code
from npu_migrate.port.transformer import Change, Finding

Status = Literal["changed", "unchanged", "failed", "copied"]


@dataclass
class FileResult:
    """What happened to one file of the input tree.

    Attributes:
        path: the file as the user named it (input PATH joined with the relative path).
        rel: the path relative to its input root (where ``--out`` puts it).
        status: ``changed``, ``unchanged``, ``failed`` (did not parse or decode; copied as it is) or
            ``copied`` (not Python).
        error: for ``failed``, the one-line reason; otherwise a note (notebook cells left alone).
        changes: the rewrites.
        findings: the sites that need a human.
        size: input size in bytes.
        output: the ported bytes, for ``changed`` files only.
        source_text: the decoded input, for ``changed`` files only (for the diff).
        output_text: the decoded output, for ``changed`` files only (for the diff).
        unreadable: the file could not be read at all (nothing to copy).
    """

    path: str
    rel: str
    status: Status
    error: str = ""
    changes: Sequence[Change] = ()
    findings: Sequence[Finding] = ()
    size: int = 0
    output: Optional[bytes] = field(default=None, repr=False)
    source_text: Optional[str] = field(default=None, repr=False)
    output_text: Optional[str] = field(default=None, repr=False)
    unreadable: bool = False


def totals(results: Sequence[FileResult]) -> dict[str, Any]:
    """Counts over a run: files by status, changes and findings by rule code."""
    status = Counter(r.status for r in results)
    changes = Counter(c.code for r in results for c in r.changes)
    findings = Counter(f.code for r in results for f in r.findings)
    return {
        "python_files": sum(status[s] for s in ("changed", "unchanged", "failed")),
        "changed": status["changed"],
        "unchanged": status["unchanged"],
        "failed": status["failed"],
        "copied": status["copied"],
        "changes": sum(changes.values()),
        "findings": sum(findings.values()),
        "changes_by_rule": dict(sorted(changes.items())),
        "findings_by_rule": dict(sorted(findings.items())),
    }


def to_json(results: Sequence[FileResult], style: str) -> dict[str, Any]:
    """The run as a JSON-serialisable object: ``style``, ``files`` (Python files only) and ``totals``."""
    files = []
    for r in results:
        if r.status == "copied":
            continue
        files.append({
            "path": r.path,
            "status": r.status,
            "error": r.error or None,
            "changes": [asdict(c) for c in r.changes],
            "findings": [asdict(f) for f in r.findings],
        })
    return {"style": style, "files": files, "totals": totals(results),
            "rules": {r.code: r.summary for r in RULES}}


def _where(item: Change | Finding) -> str:
    """``line:col``, or ``cell N:line:col`` in a notebook."""
    return f"{'' if item.cell is None else f'cell {item.cell}:'}{item.line}:{item.col}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    text = text.replace("`", "'")
    return f"`{_cell(text)}`"


def to_markdown(results: Sequence[FileResult], style: str) -> str:
    """The run as a markdown report: totals, then per file its changes and findings."""
    t = totals(results)
    out = [
        "# npu-migrate port report",
        "",
        f"Style: `{style}`. Python files: {t['python_files']} ({t['changed']} changed, {t['unchanged']} unchanged, "
        f"{t['failed']} failed); other files copied: {t['copied']}.",
        f"Changes: {t['changes']}. Findings that need a human: {t['findings']}.",
        "",
        "## Totals by rule",
        "",
        "| Rule | What | Changes | Findings |",
        "|---|---|---:|---:|",
    ]
    for code in sorted(set(t["changes_by_rule"]) | set(t["findings_by_rule"])):
        out.append(f"| {code} | {_cell(rule_by_code(code).summary)} | {t['changes_by_rule'].get(code, 0)} "
                   f"| {t['findings_by_rule'].get(code, 0)} |")
    failed = [r for r in results if r.status == "failed"]
    if failed:
        out += ["", "## Files that failed (copied unchanged)", ""]
        out += [f"- `{r.path}`: {_cell(r.error)}" for r in failed]
    for r in results:
        if not (r.changes or r.findings):
            continue
        out += ["", f"## `{r.path}`", ""]
        if r.changes:
            out += ["### Changes", "", "| Line | Rule | Before | After |", "|---:|---|---|---|"]
            for c in r.changes:
                note = f" ({_cell(c.message)})" if c.message else ""
                out.append(f"| {_where(c)} | {c.code} | {_code(c.before)} | {_code(c.after)}{note} |")
            out.append("")
        if r.findings:
            out += ["### Needs a human", "", "| Line | Rule | Reason | Suggested fix |", "|---:|---|---|---|"]
            for f in r.findings:
                out.append(f"| {_where(f)} | {f.code} | {_cell(f.message)} | {_cell(f.fix)} |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"
