"""What ``npu-migrate compare`` can read: probe directories, the examples' ``--metrics`` JSON lines, plain logs.

Usage::

    run = sources.load_run("runs/gpu")                                   # DIR/rank{R}.jsonl from --probe
    run = sources.load_run("metrics.jsonl")                              # one JSON object per line
    run = sources.load_run("train.log", pattern=r"step (?P<step>\\d+) loss (?P<loss>\\S+)")
    run.ranks[0].steps[12]["loss"]

Every input becomes a :class:`Run`: ranks, each with ``{step: {metric: value}}`` and, for probe
recordings, per-step module statistics. Only the standard library is used: reading never
imports torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from npu_migrate.compare import records
from npu_migrate.compare.recording import settings
from npu_migrate.errors import NpuMigrateError
from npu_migrate.textsafe import printable

STEP_KEYS = ("step", "iteration", "iter", "global_step", "epoch")
"""Columns that number a metrics row, in the order they are looked for."""

TIMING = re.compile(r"(^|_)(s|sec|secs|seconds|ms|time|timestamp|elapsed|per_sec|samples_per_sec|throughput|tflops|mfu)$|_s$")
"""Metrics columns that measure speed or time: never expected to match between two runs."""


class SourceError(NpuMigrateError, ValueError):
    """An input that cannot be read as a run (exit 2)."""


@dataclass
class Run:
    """One side of a comparison.

    Attributes:
        source: the path given.
        kind: ``probe``, ``metrics`` or ``log``.
        ranks: ``{rank: RankRecording}``; metrics files and logs have rank 0 only.
        notes: what was skipped while reading, for the report.
    """

    source: str
    kind: Literal["probe", "metrics", "log"]
    ranks: dict[int, records.RankRecording] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def header(self) -> dict[str, Any]:
        """The lowest rank's header (device, dtype, world size, seed, versions)."""
        return self.ranks[min(self.ranks)].header if self.ranks else {}

    def metrics(self) -> list[str]:
        """Every metric name of any step of any rank, in first-seen order."""
        names: dict[str, None] = {}
        for rec in self.ranks.values():
            for values in rec.steps.values():
                names.update(dict.fromkeys(values))
        return list(names)


def load_run(path: str, pattern: str | None = None, metrics: list[str] | None = None) -> Run:
    """Read ``path`` as a probe directory, a probe rank file, JSON lines, or (with ``pattern``) a log.

    Args:
        path: the input.
        pattern: regular expression for plain logs; named groups are metrics, ``step`` numbers
            the line (else the match count does).
        metrics: keep only these metrics (JSON lines and logs).

    Raises:
        SourceError: the input is missing or is none of these.
    """
    if not os.path.exists(path):
        raise SourceError(f"{path!r} does not exist. Pass a --probe directory, a --metrics JSONL file or a log file.")
    if os.path.isdir(path):
        return _load_probe_dir(path)
    if pattern is not None:
        return _load_log(path, pattern, metrics)
    first = _first_json(path)
    if first is None:
        raise SourceError(f"{path!r} is neither a --probe directory nor JSON lines. For a plain log, pass "
                          "--pattern REGEX with named groups, e.g. 'step (?P<step>\\d+) loss (?P<loss>\\S+)'.")
    if first.get("kind") == "header":
        rank = first.get("rank", 0)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise SourceError(f"{path}:1: not a probe record (rank {records.clean(rank)!r} is not a rank). Each line "
                              "must be a JSON object as --probe writes it; re-record the run.")
        try:
            rec = records.read_rank_file(path, rank)
        except ValueError as exc:
            raise SourceError(str(exc)) from exc
        return Run(path, "probe", {rank: rec}, list(rec.notes))
    return _load_metrics(path, metrics)


def _first_json(path: str) -> dict[str, Any] | None:
    number = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    obj = json.loads(line)
                    return obj if isinstance(obj, dict) else None
    except (ValueError, UnicodeDecodeError):
        return None
    except RecursionError:
        raise SourceError(f"{path}:{number}: JSON nested too deeply to be a probe record or a metrics row; "
                          "check that this is the file you meant.") from None
    return None


def _load_probe_dir(path: str) -> Run:
    files = settings.rank_files(path)
    if not files:
        raise SourceError(f"{path!r} has no rank{{R}}.jsonl files: expected a directory written by --probe DIR.")
    run = Run(path, "probe")
    for rank, file in files.items():
        try:
            rec = records.read_rank_file(file, rank)
        except ValueError as exc:
            raise SourceError(str(exc)) from exc
        run.ranks[rank] = rec
        run.notes.extend(rec.notes)
        if rec.end is None:
            run.notes.append(f"{file}: no end record: rank {rank} did not exit cleanly (crashed or was stopped)")
    return run


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _load_metrics(path: str, wanted: list[str] | None) -> Run:
    rec = records.RankRecording(rank=0, path=path, header={"kind": "metrics", "source": path})
    run = Run(path, "metrics", {0: rec})
    step_key: str | None = None
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                run.notes.append(f"{path}:{number}: not JSON; skipped")
                continue
            except RecursionError:
                raise SourceError(f"{path}:{number}: JSON nested too deeply to be a metrics row; expected one flat "
                                  "JSON object per line, like the examples' --metrics file.") from None
            if not isinstance(row, dict):
                continue
            if step_key is None:
                step_key = next((k for k in STEP_KEYS if _number(row.get(k)) is not None), "")
            numbered = _number(row.get(step_key)) if step_key else None
            if numbered is not None and not (math.isfinite(numbered) and numbered >= 0):
                raise SourceError(f"{path}:{number}: {step_key} {numbered} is not a step number; expected a "
                                  "non-negative number in every row.")
            step = int(numbered) if numbered is not None else len(rec.steps) + 1
            values = {}
            for key, value in row.items():
                key = printable(key, records.MAX_TEXT)
                x = _number(value)
                if x is None or key == step_key or key in ("world_size", "rank"):
                    continue
                if wanted is not None and key not in wanted:
                    continue
                if wanted is None and TIMING.search(key):
                    continue
                values[key] = x
            rec.steps[step] = values  # a resumed run repeats steps: the last row wins
            for key in ("device", "backend", "world_size", "dtype"):
                if key in row and key not in rec.header:
                    rec.header[key] = records.clean(row[key], records.MAX_DEPTH)  # a scalar, shown as text
    if not rec.steps:
        raise SourceError(f"{path!r} has no JSON object lines: expected rows like the examples' --metrics file.")
    rec.header["step_key"] = step_key or "line"
    return run


def _load_log(path: str, pattern: str, wanted: list[str] | None) -> Run:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise SourceError(f"--pattern {pattern!r} is not a regular expression ({exc}).") from exc
    names = [n for n in regex.groupindex if n != "step"]
    if not names and regex.groups != 1:
        raise SourceError(f"--pattern {pattern!r} has no named group to read a value from: name them, e.g. "
                          "'loss (?P<loss>\\S+)', or use exactly one unnamed group.")
    rec = records.RankRecording(rank=0, path=path, header={"kind": "log", "source": path, "pattern": pattern})
    run = Run(path, "log", {0: rec})
    count = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            found = regex.search(line)
            if not found:
                continue
            count += 1
            step = count
            if "step" in regex.groupindex and found.group("step"):
                try:
                    step = int(found.group("step"))
                except ValueError:
                    raise SourceError(f"{path}:{number}: the step {printable(repr(found.group('step')), 80)} matched "
                                      "by --pattern is not an integer; make (?P<step>...) match digits only, "
                                      "e.g. (?P<step>\\d+).") from None
            values = {}
            for name in names or ["value"]:
                text = found.group(name) if names else found.group(1)
                if text is None or (wanted is not None and name not in wanted):
                    continue
                try:
                    values[name] = float(text)
                except ValueError:
                    values[name] = math.nan
                    run.notes.append(f"{path}: {name} {printable(repr(text), 80)} of step {step} is not a number; "
                                     "counted as NaN")
            rec.steps[step] = values
    if not rec.steps:
        raise SourceError(f"--pattern {pattern!r} matched no line of {path!r}.")
    return run
