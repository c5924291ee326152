"""The audit's report: a JSON document scripts can rely on, markdown for people, and the exit status.

Usage::

    from npu_migrate.ops import report

    data = report.build(recorder, watch, operators, script="train.py", ended="2 optimizer step(s) recorded")
    print(report.to_markdown(data))
    report.write_json(data, "ops.json")
    report.exit_status(data)        # 0: every operator runs on the NPU; 1: some fall back or fail

JSON (``FORMAT`` 1)::

    {"format": 1, "torch": "2.14.0", "torch_npu": "2.14.0", "op_list": "cache", "script": "train.py",
     "steps": 2, "ended": "...", "verdict": "cpu_fallback",
     "requires_torch": "torch==2.14.0.*",
     "summary": {"npu": 812, "decomposed": 40, "cpu_fallback": 4, "no_kernel": 0, "error": 0},
     "per_phase": {"forward": {"npu": 60.5, "decomposed": 12.0, "cpu_fallback": 2.0, "no_kernel": 0.0,
                               "error": 0.0}, ...},
     "ops": [{"op": "aten::special_entr", "overload": "default", "verdict": "cpu_fallback", "count": 4,
              "per_step": 2.0, "dtypes": ["float32"], "site": "train.py:41", "phase": "forward",
              "function": "torch.special.entr", "via": [], "hint": "..."},
             {"op": "aten::_logcumsumexp", ..., "function": "torch.logcumsumexp",
              "via": ["aten::logcumsumexp"], ...}, ...],
     "risks": {"float64": [{"op": ..., "count": ..., "per_step": ..., "site": ..., "dtypes": [...]}],
               "syncs": [{"what": "aten::_local_scalar_dense", "count": 2, "per_step": 1.0, "site": ...}]},
     "cuda_only": [{"name": "flash_attn", "site": "train.py:3", "advice": "...", "error": ""}]}

``summary`` counts calls; ``per_phase`` counts them per optimizer step (per run without steps). ``verdict`` is
the worst one met: ``error``, ``no_kernel``, ``cpu_fallback``, else ``npu``. ``via`` names the composite
kernels, outermost first, through which the NPU reaches an operator the user's code did not call itself
(:mod:`npu_migrate.ops.follow`); ``function`` is still the torch function the user called.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from npu_migrate.ops.verdict import Verdict
from npu_migrate.textsafe import printable

FORMAT = 1
_RISKY_DTYPES = ("float64", "complex64", "complex128", "complex32")
_WORST_FIRST = (Verdict.ERROR, Verdict.NO_KERNEL, Verdict.CPU_FALLBACK, Verdict.DECOMPOSED, Verdict.NPU)
_SAYS = {Verdict.CPU_FALLBACK.value: "CPU fallback", Verdict.NO_KERNEL.value: "no kernel (fails on the NPU)",
         Verdict.ERROR.value: "error"}


def _short(site: str) -> str:
    """``train.py:41`` for a site in or under the working directory; else the path as recorded."""
    path, _, line = site.rpartition(":")
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return site
    return f"{rel}:{line}" if not rel.startswith("..") else site


def build(recorder: Any, watch: Any, operators: Any, script: str, ended: str) -> dict[str, Any]:
    """The report of one audit (see the module docstring for its shape)."""
    per = max(recorder.steps_done, 1)
    ops = []
    summary = {v.value: 0 for v in Verdict}
    for (op, overload, phase, site, via), entry in recorder.entries.items():
        summary[entry.verdict.value] += entry.count
        ops.append({
            "op": op, "overload": overload, "verdict": entry.verdict.value, "count": entry.count,
            "per_step": round(entry.count / per, 2), "dtypes": sorted(entry.dtypes), "site": _short(site),
            "phase": phase, "function": entry.function, "via": list(via),
            "hint": recorder.judge.hint(op, overload, entry.verdict),
        })
    order = {v.value: i for i, v in enumerate(_WORST_FIRST)}
    ops.sort(key=lambda o: (order[o["verdict"]], -o["count"], o["op"], o["site"]))
    float64 = [{"op": o["op"], "count": o["count"], "per_step": o["per_step"], "site": o["site"],
                "dtypes": [d for d in o["dtypes"] if d in _RISKY_DTYPES]}
               for o in ops if any(d in _RISKY_DTYPES for d in o["dtypes"])]
    syncs = [{"what": s.what, "count": s.count, "per_step": round(s.count / per, 2), "site": _short(site)}
             for (what, site), s in sorted(recorder.syncs.items(), key=lambda kv: -kv[1].count)]
    phases: dict[str, dict[str, float]] = {}
    for o in ops:
        row = phases.setdefault(o["phase"], {v.value: 0.0 for v in Verdict})
        row[o["verdict"]] = round(row[o["verdict"]] + o["count"] / per, 2)
    worst = next((v for v in _WORST_FIRST if v.bad and summary[v.value]), Verdict.NPU)
    return {
        "format": FORMAT, "torch": torch.__version__.split("+")[0], "torch_npu": operators.release,
        "op_list": operators.source, "requires_torch": operators.requires_torch, "script": script, "steps": recorder.steps_done, "ended": ended,
        "verdict": worst.value, "summary": summary, "per_phase": phases, "ops": ops,
        "risks": {"float64": float64, "syncs": syncs},
        "cuda_only": [{"name": f.name, "site": _short(f.site), "advice": f.advice, "error": f.error}
                      for f in watch.found],
    }


def exit_status(data: dict[str, Any]) -> int:
    """0 when every operator runs on the NPU (natively or decomposed), 1 when some fall back or fail."""
    return 1 if data["verdict"] != Verdict.NPU.value else 0


_PHASE_ORDER = {"forward": 0, "backward": 1, "optimizer step": 2, "other": 3}


def _series(version: str) -> str:
    """``2.14`` for ``2.14.0``."""
    return ".".join(version.split(".")[:2])


def _cell(text: Any) -> str:
    return printable(str(text)).replace("|", "\\|")


def _called_as(o: dict[str, Any]) -> str:
    """The torch function the user called, then the composites on the way (``torch.x → aten::x``)."""
    return " → ".join(step for step in (o["function"], *o.get("via", ())) if step)


def _path(o: dict[str, Any]) -> str:
    """``torch.logcumsumexp` at train.py:41 → `aten::logcumsumexp` → `aten::_logcumsumexp`` (in backticks)."""
    start = f"`{_cell(o['function'])}` at {_cell(o['site'])}" if o["function"] else (
        f"{_cell(o['phase'])} at {_cell(o['site'])}")
    steps = [*o["via"], o["op"] if o["overload"] in ("default", "") else f"{o['op']}.{o['overload']}"]
    return " → ".join([start, *(f"`{_cell(step)}`" for step in steps)])


def to_markdown(data: dict[str, Any]) -> str:
    """The report for people: the verdict, the operators that fall back or fail, then the risks."""
    s = data["summary"]
    bad = [o for o in data["ops"] if Verdict(o["verdict"]).bad]
    distinct = len({(o["op"], o["overload"]) for o in bad})
    lines = [
        f"# Operator audit: {_cell(data['script'])} on torch-npu {_cell(data['torch_npu'])} (torch {data['torch']})",
        "",
        f"Recorded {data['steps']} optimizer step(s) ({_cell(data['ended'])}); operator list: {_cell(data['op_list'])}.",
        "",
        f"**Verdict: {data['verdict']}**: {s['npu']} call(s) run on the NPU, {s['decomposed']} decompose into "
        f"others, {s['cpu_fallback']} fall back to the CPU, "
        + (f"{s['no_kernel']} have no kernel on the NPU or the host, " if s.get("no_kernel") else "")
        + f"{s['error']} fail"
        + (f" ({distinct} operator(s) to look at)." if bad else "."),
        "",
    ]
    series = _series(data["torch"])
    if data.get("requires_torch") and series and series not in data["requires_torch"]:
        lines += [f"Note: torch-npu {_cell(data['torch_npu'])} requires {_cell(data['requires_torch'])}, and this is "
                  f"torch {data['torch']}: operators the two torch versions decompose differently may be judged "
                  "differently on the NPU host. Audit with the torch that release needs for exact verdicts.", ""]
    if data.get("per_phase"):
        shown = [v for v in Verdict if v is not Verdict.NO_KERNEL or s.get("no_kernel")]
        lines += ["| phase | " + " | ".join(v.value for v in shown) + " |", "|---" * (len(shown) + 1) + "|"]
        lines += [f"| {phase} | " + " | ".join(f"{row.get(v.value, 0):g}" for v in shown) + " |"
                  for phase, row in sorted(data["per_phase"].items(), key=lambda kv: _PHASE_ORDER.get(kv[0], 9))]
        lines += ["", "Calls per optimizer step (per run where the script made none).", ""]
    if bad:
        lines += ["## Operators that fall back or fail", "",
                  "| operator | verdict | per step | dtypes | phase | call site | called as | hint |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| `{_cell(o['op'])}.{_cell(o['overload'])}` | {o['verdict']} | {o['per_step']:g} | "
                  f"{', '.join(o['dtypes'])} | {o['phase']} | {_cell(o['site'])} | {_cell(_called_as(o))} | "
                  f"{_cell(o['hint'])} |" for o in bad]
        lines.append("")
        inside = [o for o in bad if o.get("via")]
        if inside:
            lines += ["Reached through composite kernels the release does not replace (the NPU runs torch's "
                      "kernel, and it calls these):", ""]
            lines += [f"- {_path(o)}: {_SAYS.get(o['verdict'], o['verdict'])} ({o['phase']}, {o['per_step']:g} "
                      "per step)" for o in inside]
            lines.append("")
    risks = data["risks"]
    if risks["float64"] or risks["syncs"]:
        lines += ["## Risks", ""]
        if risks["float64"]:
            lines += ["float64/complex tensors on the device (the NPU computes them slowly or on the host):", "",
                      "| operator | per step | dtypes | call site |", "|---|---|---|---|"]
            lines += [f"| `{_cell(r['op'])}` | {r['per_step']:g} | {', '.join(r['dtypes'])} | {_cell(r['site'])} |"
                      for r in risks["float64"]]
            lines.append("")
        if risks["syncs"]:
            lines += ["Host synchronisations (the host waits for the device):", "",
                      "| cause | per step | call site |", "|---|---|---|"]
            lines += [f"| `{_cell(r['what'])}` | {r['per_step']:g} | {_cell(r['site'])} |" for r in risks["syncs"]]
            lines.append("")
    if data["cuda_only"]:
        lines += ["## CUDA-only code", "", "| what | where | what to do |", "|---|---|---|"]
        lines += [f"| `{_cell(f['name'])}`{' (' + _cell(f['error']) + ')' if f['error'] else ''} | "
                  f"{_cell(f['site'])} | {_cell(f['advice'])} |" for f in data["cuda_only"]]
        lines.append("")
    return "\n".join(lines)


def write_json(data: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")


def write_markdown(data: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(to_markdown(data) + "\n")
