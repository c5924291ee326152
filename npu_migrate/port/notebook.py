"""Port Jupyter notebooks (``.ipynb``): code cells are ported as one module, everything else is kept.

Usage::

    from npu_migrate.port.notebook import port_notebook

    result = port_notebook(open("nb.ipynb", encoding="utf-8").read())
    result.text                       # the notebook JSON, ported (the input itself if nothing changed)
    for f in result.findings:         # f.cell is the code cell's index in the notebook
        print(f"nb.ipynb:cell {f.cell}:{f.line}:{f.col} {f.code} {f.message}")

All code cells are joined into one module, separated by marker statements, so an import in the
first cell counts for a call in the tenth, and the import ``nm`` needs lands in the first code
cell. IPython syntax is kept exactly: line magics (``%matplotlib``), shell lines (``!nvidia-smi``,
``files = !ls``) and help lines (``obj?``) are swapped for placeholders while porting; a cell
that starts with a cell magic (``%%bash``) is left alone unless the magic only times or captures
Python (``%%time``, ``%%timeit``, ``%%capture``). Outputs, attachments and metadata are kept;
the result is nbformat JSON with one-space indentation, as Jupyter writes it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from npu_migrate.port import PortSyntaxError, port_source
from npu_migrate.port.transformer import Change, Finding

_MARKER = "__npu_migrate_cell__"
_MARKER_RE = re.compile(rf"^{_MARKER}\((\d+)\)\n?$")
_MAGIC = "__npu_migrate_magic__"
_MAGIC_RE = re.compile(rf"^(\s*){_MAGIC}\((\d+)\)$")
_IPYTHON_LINE = re.compile(r"^\s*([%!]|[\w.\[\]]+\s*=\s*[%!])|.*\?\s*$")
_PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")


class NotebookError(ValueError):
    """The file is not a notebook this tool can read (the message says why)."""


@dataclass(frozen=True)
class NotebookResult:
    """What porting one notebook did.

    Attributes:
        source: the input text.
        text: the ported notebook JSON (the input itself when nothing changed).
        changes: every rewrite; ``cell`` is the code cell's index among all cells.
        findings: every site that needs a human, with its cell.
        skipped: cells left alone, as ``(cell, reason)``.
    """

    source: str
    text: str
    changes: tuple[Change, ...] = ()
    findings: tuple[Finding, ...] = ()
    skipped: tuple[tuple[int, str], ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the notebook changed."""
        return self.text != self.source


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _hide_ipython(code: str, magics: list[str]) -> Optional[str]:
    """``code`` with IPython-only lines replaced by placeholders; ``None`` for a non-Python cell magic."""
    lines = code.split("\n")
    if lines and lines[0].startswith("%%"):
        if not lines[0].split()[0] in _PYTHON_CELL_MAGICS:
            return None
    out = []
    for line in lines:
        if line.strip() and _IPYTHON_LINE.match(line) and not line.lstrip().startswith("#"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{_MAGIC}({len(magics)})")
            magics.append(line.strip())
        else:
            out.append(line)
    return "\n".join(out)


def _restore_ipython(code: str, magics: Sequence[str]) -> str:
    out = []
    for line in code.split("\n"):
        m = _MAGIC_RE.match(line)
        out.append(m.group(1) + magics[int(m.group(2))] if m else line)
    return "\n".join(out)


def _as_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def port_notebook(text: str, style: str = "npu_migrate", select: Optional[Sequence[str]] = None,
                  ignore: Optional[Sequence[str]] = None, report_only: bool = False) -> NotebookResult:
    """Port the code cells of a notebook.

    Args:
        text: the notebook's JSON text.
        style: as :func:`npu_migrate.port.port_source`.
        select: rule codes or prefixes to apply.
        ignore: rule codes or prefixes to leave out.
        report_only: report instead of rewriting (``npu-migrate check``).

    Returns:
        The ported notebook and what changed, by cell.

    Raises:
        NotebookError: not JSON, or not a notebook (no ``cells`` list).
    """
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"not a notebook: invalid JSON at line {exc.lineno}, column {exc.colno}") from exc
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a notebook: no 'cells' list (nbformat 4 is expected)")
    magics: list[str] = []
    parts: list[str] = []
    starts: list[tuple[int, int]] = []  # (first line of the cell in the joined module, cell index)
    skipped: list[tuple[int, str]] = []
    line = 1
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        code = _hide_ipython(_source(cell), magics)
        if code is None:
            skipped.append((index, "cell magic: not Python"))
            continue
        try:
            compile(code + "\n", f"<cell {index}>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            skipped.append((index, f"does not parse: {getattr(exc, 'msg', exc)}"))
            continue
        block = code if code.endswith("\n") else code + "\n"
        if parts:
            parts.append(f"{_MARKER}({index})\n")
            line += 1
        else:
            parts.append(f"{_MARKER}({index})\n")
            line += 1
        starts.append((line, index))
        parts.append(block)
        line += block.count("\n")
    if not starts:
        return NotebookResult(text, text, skipped=tuple(skipped))
    joined = "".join(parts)
    try:
        result = port_source(joined, style=style, select=select, ignore=ignore, report_only=report_only)
    except PortSyntaxError as exc:  # the cells parse one by one, so this is a bug of the joining
        raise NotebookError(f"the code cells do not parse together: {exc}") from exc

    def locate(item: Any) -> Any:
        cell_line, cell = 1, None
        for start, index in starts:
            if item.line >= start:
                cell_line, cell = start, index
        return dataclasses.replace(item, line=item.line - cell_line + 1, cell=cell)

    changes = tuple(locate(c) for c in result.changes)
    findings = tuple(locate(f) for f in result.findings)
    if not result.changed:
        return NotebookResult(text, text, changes, findings, tuple(skipped))
    # Split the ported module at the markers; code above the first marker (imports the port added
    # before it) belongs to the first code cell.
    sections: dict[int, list[str]] = {}
    current: Optional[int] = None
    head: list[str] = []
    for row in result.code.splitlines(keepends=True):
        m = _MARKER_RE.match(row)
        if m:
            current = int(m.group(1))
            sections[current] = []
            continue
        (sections[current] if current is not None else head).append(row)
    first = starts[0][1]
    sections[first] = head + sections[first]
    for index, rows in sections.items():
        cell = nb["cells"][index]
        original = _source(cell)
        new = _restore_ipython("".join(rows), magics)
        if not original.endswith("\n"):
            new = new.rstrip("\n")
        if new != original:
            cell["source"] = _as_lines(new) if isinstance(cell.get("source"), list) else new
    out = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    return NotebookResult(text, out, changes, findings, tuple(skipped))
