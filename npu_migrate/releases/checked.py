"""Which torch lines this checkout was checked on, and when: ``.ci/matrix``'s table as data.

Usage::

    from npu_migrate.releases import checked

    checked.lines()          # [{"torch": "2.1.0", "ok": True, "date": "2026-11-28", "commit": "36e80b5"}, ...]
    checked.of("2.7.1+cu126")   # that line's entry (the release, any local build), or None

``.ci/matrix`` runs a smoke set on every torch a torch-npu release pairs with and writes its table
into docs/ascend-versions.md; it also writes that table's rows into ``checked.json`` beside this
module, which ships with the package, so that ``npu-migrate env`` can say whether the running
torch's line was checked, and when, where the docs are not at hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("checked.json")
"""The table's rows, written by ``.ci/matrix`` (``{"source", "lines": [...]}``)."""


def lines() -> list[dict[str, Any]]:
    """Every checked torch line, oldest first; empty where the file is missing or unreadable."""
    try:
        found = json.loads(PATH.read_text(encoding="utf-8"))["lines"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [line for line in found if isinstance(line, dict) and isinstance(line.get("torch"), str)]


def of(torch_version: str) -> dict[str, Any] | None:
    """The entry of ``torch_version``'s line (``2.7.1+cu126`` is line 2.7.1), or None if unchecked."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(torch_version).base_version
    except InvalidVersion:
        return None
    return next((line for line in lines() if line["torch"] == release), None)


def summary(torch_version: str) -> str:
    """One line for ``npu-migrate env``: whether this torch's line was checked, and when."""
    every = lines()
    if not every:
        return "unknown (no record of .ci/matrix in this installation)"
    entry = of(torch_version)
    names = ", ".join(line["torch"] for line in every)
    if entry is None:
        return f"not checked: .ci/matrix checks the lines {names} (docs/ascend-versions.md)"
    state = "every check passed" if entry.get("ok") else "some checks failed (docs/ascend-versions.md)"
    return f"{entry['torch']}: {state} on {entry.get('date')}, commit {entry.get('commit')} (.ci/matrix)"
