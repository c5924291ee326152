"""What one process's migration redirected, and the merge of many processes' records.

Usage::

    from npu_migrate.migrate import report

    report.REPORT.record("Tensor.cuda", "redirected", "train.py:12")
    report.write(report.merge(directory), "report.md")

Each process keeps counts in memory and, when a report directory is set
(``NPU_MIGRATE_REPORT_DIR``), writes ``migrate-<host>-<pid>.json`` there when it ends. The
launcher and ``npu-migrate run`` merge those files into one markdown or JSON report. Both are
redacted (:mod:`npu_migrate.redact`) and written privately (:mod:`npu_migrate.fileio`).
"""

from __future__ import annotations

import glob
import json
import os
import socket
import sys
from typing import Any

from npu_migrate import fileio, redact
from npu_migrate.migrate.environment import ENV_REPORT_DIR

KINDS = ("redirected", "noop", "unmapped")
NOTHING_SEEN = "migration saw no CUDA or accelerator call: did the script stop at a device check?"
"""The warning of a migrated job in which no process met a CUDA or ``torch.accelerator`` call.

Such a job usually exited early on its own: pytorch/examples' FSDP2 example prints "Unable to
locate sufficient 2 gpus" and exits 0 when ``torch.accelerator`` is not answered. Exit status 0
alone would tell the user the migration worked.
"""


class Report:
    """Counts per API: how often it was met, what was done, and the first call site."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.target = ""
        self.user_code: list[dict[str, str]] = []  # the user-code roots (callers.reset)
        self.left_alone: dict[str, int] = {}  # api -> calls from library code, given torch's answer

    def record(self, api: str, kind: str, site: str | None, detail: str = "") -> None:
        entry = self.entries.get(api)
        if entry is None:
            self.entries[api] = {"kind": kind, "count": 1, "first_site": site or "?", "detail": detail}
        else:
            entry["count"] += 1

    def reset(self) -> None:
        self.entries = {}
        self.left_alone.clear()

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "rank": os.environ.get("RANK"),
            "target": self.target,
            "argv0": sys.argv[0] if sys.argv else "",
            "entries": {api: dict(e, library_calls=self.left_alone.get(api, 0)) for api, e in self.entries.items()},
            "user_code": self.user_code,
            "left_alone": self.left_alone,
        }

    def dump(self) -> str | None:
        """Write this process's record to the report directory, if one is set and there is news."""
        directory = os.environ.get(ENV_REPORT_DIR)
        if not directory or not self.entries:
            return None
        path = os.path.join(directory, f"migrate-{socket.gethostname()}-{os.getpid()}.json")
        try:
            fileio.write_private_atomic(path, json.dumps(redact.value(self.as_dict())))
        except (OSError, ValueError):
            return None
        return path


REPORT = Report()


def merge(directory: str) -> dict[str, Any]:
    """Merge every process's record in ``directory`` into one report."""
    processes = []
    for path in sorted(glob.glob(os.path.join(directory, "migrate-*.json"))):
        try:
            with open(path, encoding="utf-8") as fh:
                processes.append(json.load(fh))
        except (OSError, ValueError):
            continue
    apis: dict[str, dict[str, Any]] = {}
    for proc in processes:
        for api, entry in proc["entries"].items():
            merged = apis.setdefault(api, {"kind": entry["kind"], "count": 0, "processes": 0,
                                           "first_site": entry["first_site"], "detail": entry.get("detail", "")})
            merged["count"] += entry["count"]
            merged["processes"] += 1
        for api, calls in proc.get("left_alone", {}).items():
            if api in apis:
                apis[api]["library_calls"] = apis[api].get("library_calls", 0) + calls
    targets = sorted({p["target"] for p in processes if p.get("target")})
    warnings = [] if apis else [NOTHING_SEEN]
    user_code = sorted({(r["path"], r["source"], r.get("name", "")) for p in processes for r in p.get("user_code", [])})
    return {"processes": len(processes), "targets": targets, "apis": dict(sorted(apis.items())),
            "user_code": [{"path": p, "source": s, "name": n} for p, s, n in user_code], "warnings": warnings}


def to_markdown(report: dict[str, Any]) -> str:
    lines = [
        "# npu_migrate runtime migration report",
        "",
        f"Processes: {report['processes']}; target: {', '.join(report['targets']) or '-'}",
        "",
        *[f"**Warning: {w}**\n" for w in report.get("warnings", [])],
        "## User code (CUDA calls from here are migrated; torch, site-packages and other libraries get torch's answers)",
        "",
        *[f"- `{r['path']}` ({r['source']}{': ' + r['name'] if r['name'] else ''})" for r in report.get("user_code", [])],
        "",
    ]
    titles = {
        "redirected": "Redirected",
        "noop": "Harmless no-ops on the target",
        "unmapped": "CUDA APIs that could not be mapped (need a human)",
    }
    for kind in KINDS:
        rows = [(api, e) for api, e in report["apis"].items() if e["kind"] == kind]
        lines += [f"## {titles[kind]}", ""]
        if not rows:
            lines += ["(none)", ""]
            continue
        lines += ["| API | calls | library calls left alone | processes | first call site | note |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{api}` | {e['count']} | {e.get('library_calls', 0)} | {e['processes']} | {e['first_site']} | "
                  f"{e['detail']} |" for api, e in rows]
        lines.append("")
    return "\n".join(lines)


def write(report: dict[str, Any], path: str) -> None:
    """Write a merged report as JSON (``.json``) or markdown (anything else), secrets redacted.

    Written whole through a temporary file and a rename, private to the user
    (:func:`npu_migrate.fileio.write_private_atomic`).
    """
    report = redact.value(report)
    text = json.dumps(report, indent=2) if path.endswith(".json") else to_markdown(report)
    fileio.write_private_atomic(path, text + "\n")
