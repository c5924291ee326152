"""``.ci/matrix``'s record, as the package ships it: the docs' table and ``checked.json`` agree, and
``npu-migrate env`` says whether the running torch's line was checked, and when."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from npu_migrate.releases import checked

ROOT = Path(__file__).resolve().parents[2]


def _doc_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "ascend-versions.md").read_text(encoding="utf-8")
    section = text[text.index("## The version matrix"):]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if re.match(r"^\| \d", line)]


def test_the_shipped_record_is_the_docs_table() -> None:
    rows = _doc_rows()
    assert rows, "docs/ascend-versions.md has no matrix rows"
    assert [line["torch"] for line in checked.lines()] == [row[0] for row in rows]
    for line, row in zip(checked.lines(), rows):
        assert line["ok"] == all(cell == "ok" for cell in row[4:11]), (line, row)
        assert row[-1].startswith(f"{line['date']}, "), (line, row)


def test_a_line_is_found_whatever_the_local_build_and_an_unchecked_one_says_so() -> None:
    first = checked.lines()[0]["torch"]
    assert checked.of(f"{first}+cu121")["torch"] == first
    assert checked.of("2.2.0") is None  # no torch-npu release pairs with torch 2.2
    assert checked.summary("2.2.0").startswith("not checked: .ci/matrix checks the lines 2.1.0, ")
    assert checked.of("not a version") is None


def test_env_says_whether_this_torch_line_was_checked() -> None:
    done = subprocess.run([sys.executable, "-m", "npu_migrate", "env", "--device", "cpu", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)["torch_line_checked"]
    entry = checked.of(torch.__version__)
    if entry is None:
        assert said.startswith("not checked: "), said
    else:
        assert said.startswith(f"{entry['torch']}: ") and entry["date"] in said, said
