"""The job's end as a JSON file: every rank's exit, the first failure, the hang (``--error-file``).

Every string in the report that a rank or another launcher wrote (messages, tracebacks, a lost
node's host, a hang's stacks) goes through :func:`npu_migrate.textsafe.printable` (newlines kept):
a report can be shown with ``cat`` without what it quotes driving the terminal.

Usage (by the supervisor, once the job has ended on this node)::

    report = build(cfg, code, ranks, first_failure, hang)
    write(cfg, report)        # --error-file FILE, and report-node{K}.json in --log-dir

torchrun writes an error file only for ranks decorated with ``@record``; this one needs nothing in
the script. One file per node: its own ranks, and the job's first failure as every node agrees on
it (chosen by when it happened, across nodes). Layout (``version`` 1)::

    {"version": 1, "node_rank": 0, "host": "gpu7", "exit_code": 1, "outcome": "failed",
     "first_failure": {"kind": "rank"|"hang"|"lost", "rank": 1, "message_line": "...", "time": ...},
                      # "lost": {"node_rank": 1, "host": "gpu8 (10.0.0.8)", "message": "lost node 1 ...",
                      #          "after": {the rank failure it caused, when a rank's error named it}}
     "hang": {"summary": "...", "behind": [1], "states": {...}, "stacks": {"0": "...", ...}} | null,
     "ranks": [{"rank": 0, "local_rank": 0, "pid": 123, "exit_code": -15, "signal": "SIGTERM",
                "stopped_by_launcher": true, "first_failure": false, "exc_type": null,
                "message": null, "traceback": null, "hint": null}, ...],
     "npu_warnings": {"0": {"cpu_fallback": {"aten::isin.Tensor_Tensor_out": 3}, "aicpu": {...}}}}
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

from npu_migrate import fileio, redact
from npu_migrate import npu_lines
from npu_migrate.launch.nodes.records import FailureRecord
from npu_migrate.textsafe import printable

VERSION = 1
TEXT_LIMIT = 20000
"""Characters kept of one string in the report: a long traceback or a rank's stack, not a log."""


@dataclass
class RankExit:
    """How one rank of this node ended.

    Attributes:
        rank, local_rank, node_rank: where it ran.
        pid: its process id.
        exit_code: its exit status (negative: killed by that signal), None if never reaped.
        signal: the signal's name when it was killed by one.
        stopped_by_launcher: the launcher stopped it (another rank failed, or a hang, or a signal).
        first_failure: this rank's failure is the job's first.
        exc_type, message, traceback: its uncaught Python exception, when there was one (or the
            Python stack faulthandler wrote at a fatal signal, as ``traceback``).
        hint: what to check, for its signal or a known backend error.
    """

    rank: int
    local_rank: int
    node_rank: int
    pid: int | None
    exit_code: int | None
    signal: str | None = None
    stopped_by_launcher: bool = False
    first_failure: bool = False
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    hint: str | None = None


def build(node_rank: int, exit_code: int, outcome: str, ranks: list[RankExit],
          first_failure: FailureRecord | None, hang: dict[str, Any] | None) -> dict[str, Any]:
    """The report of this node's share of the job (see the module docstring); ``first_failure``
    becomes its JSON record here."""
    return {
        "version": VERSION,
        "node_rank": node_rank,
        "host": socket.gethostname(),
        "time": time.time(),
        "exit_code": exit_code,
        "outcome": outcome,
        "first_failure": _printable(first_failure.record() if first_failure is not None else None),
        "hang": _printable(hang),
        "ranks": [_printable(asdict(r)) for r in ranks],
        "npu_warnings": _printable(npu_lines.COLLECTED.by_rank()),  # torch_npu's fallback/AiCPU/float64 lines per rank
    }


def _printable(value: Any) -> Any:
    """``value`` with every string in it made printable (dicts and lists walked; keys too)."""
    if isinstance(value, str):
        return printable(value, TEXT_LIMIT, keep_newlines=True)
    if isinstance(value, dict):
        return {_printable(str(k)): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    return value


def paths(error_file: str | None, log_dir: str | None, node_rank: int) -> list[str]:
    """Where the report goes: ``--error-file`` and ``--log-dir``/report-node{K}.json."""
    found = [error_file] if error_file else []
    if log_dir:
        found.append(os.path.join(log_dir, f"report-node{node_rank}.json"))
    return found


def write(report: dict[str, Any], targets: list[str]) -> list[str]:
    """Write ``report`` whole (by rename) to every target; return the ones that failed, with why."""
    failed = []
    for path in targets:
        try:
            # secrets redacted; whole, never through a planted symlink, private (npu_migrate.fileio)
            fileio.write_private_atomic(path, json.dumps(redact.value(report), indent=1))
        except (OSError, ValueError) as exc:  # ValueError: NPU_MIGRATE_FILE_MODE is not a mode
            failed.append(f"{path} ({getattr(exc, 'strerror', None) or exc})")
    return failed
