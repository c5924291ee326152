"""What a comparison says: the markdown summary printed by ``npu-migrate compare`` and its ``--json`` form.

Usage::

    print(report.markdown(result))
    report.write_json(result, "compare.json")

Both carry the same facts: verdict, tolerance, the first step out of tolerance, max absolute
and relative errors per metric and for module records, the first culprit, and everything that
only one run has.
"""

from __future__ import annotations

import json
import math
from typing import Any

from npu_migrate import fileio
from npu_migrate.compare.reading.align import spans
from npu_migrate.compare.reading.verdict import Comparison


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.6g}"


def _finite(x: Any) -> Any:
    """JSON has no NaN or Infinity: write them as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _side(run: Any) -> dict[str, Any]:
    header = run.header
    keep = ("device", "device_name", "default_dtype", "world_size", "seed", "versions", "host", "settings")
    return {"source": run.source, "kind": run.kind, "ranks": sorted(run.ranks),
            **{k: header[k] for k in keep if k in header}}


def _autocast(run: Any) -> str:
    seen = sorted({d for rec in run.ranks.values() for d in rec.autocast.values()})
    return "/".join(seen) if seen else "off"


def _float32_math(run: Any) -> str:
    seen = sorted({f for rec in run.ranks.values() for f in rec.float32_math.values()})
    return "/".join(seen) if seen else "float32"


def verdict_line(result: Comparison) -> str:
    """One line: PASS or DIVERGED, and why."""
    if result.passed:
        allowed = f" ({len(result.failing_steps)} failing step(s) allowed)" if result.failing_steps else ""
        return f"PASS: within tolerance{allowed}"
    why = []
    if result.nonfinite_steps:
        why.append(f"NaN/Inf at step(s) {spans(result.nonfinite_steps)}")
    if len(result.failing_steps) > result.allow_failing_steps:
        why.append(f"{len(result.failing_steps)} step(s) out of tolerance (allowed {result.allow_failing_steps}), "
                   f"first at step {min(result.failing_steps)}")
    if result.problems:
        why.append("the runs do not cover the same ranks/steps/modules")
    return "DIVERGED: " + "; ".join(why)


def to_dict(result: Comparison) -> dict[str, Any]:
    """Everything the report shows, as plain JSON types (NaN and Inf as strings)."""
    culprit = result.culprit
    data = {
        "passed": result.passed,
        "exit_code": result.exit_code,
        "verdict": verdict_line(result),
        "tolerance": {"description": result.tolerance.describe(), "rtol": result.tolerance.rtol,
                      "atol": result.tolerance.atol, "exact": result.tolerance.exact,
                      "dtype": result.tolerance.dtype, "allow_failing_steps": result.allow_failing_steps},
        "a": _side(result.a),
        "b": _side(result.b),
        "first_step": result.first_step,
        "failing_steps": result.failing_steps,
        "nonfinite_steps": result.nonfinite_steps,
        "max_abs": result.max_abs,
        "max_rel": result.max_rel,
        "ranks": result.alignment.ranks,
        "steps_compared": {str(r): len(s) for r, s in result.alignment.steps.items()},
        "metrics": {
            name: {"compared": m.compared, "max_abs": m.max_abs, "max_abs_at": m.max_abs_at, "max_rel": m.max_rel,
                   "max_rel_at": m.max_rel_at, "failing": m.failing, "nonfinite": m.nonfinite, "first": m.first}
            for name, m in result.metrics.items()
        },
        "modules": {
            "steps_compared": result.module_steps_compared, "entries_compared": result.module_entries_compared,
            "max_abs": result.module_max_abs, "max_rel": result.module_max_rel,
            "failing": {str(r): s for r, s in result.module_failing.items()},
            "nonfinite": {str(r): s for r, s in result.module_nonfinite.items()},
            "first_difference": result.module_first,
        },
        "culprit": None if culprit is None else {
            "module": culprit.module, "phase": culprit.phase, "rank": culprit.rank, "step": culprit.step,
            "worst": culprit.worst, "inherited": culprit.inherited},
        "culprit_note": result.culprit_note,
        "problems": result.problems,
        "only_a": {"ranks": result.alignment.only_a_ranks,
                   "steps": {str(r): s for r, s in result.alignment.only_a_steps.items()},
                   "metrics": result.alignment.only_a_metrics, "module_entries": result.only_a_entries},
        "only_b": {"ranks": result.alignment.only_b_ranks,
                   "steps": {str(r): s for r, s in result.alignment.only_b_steps.items()},
                   "metrics": result.alignment.only_b_metrics, "module_entries": result.only_b_entries},
        "notes": result.notes,
    }
    return _finite(data)


def write_json(result: Comparison, path: str) -> None:
    """Write :func:`to_dict` to ``path`` (whole, private: :func:`npu_migrate.fileio.write_private_atomic`)."""
    fileio.write_private_atomic(path, json.dumps(to_dict(result), indent=2, allow_nan=False) + "\n")


def markdown(result: Comparison) -> str:
    """The summary ``npu-migrate compare`` prints."""
    a, b = _side(result.a), _side(result.b)
    lines = [f"# npu-migrate compare: {verdict_line(result)}", ""]
    lines.append("| | A | B |")
    lines.append("|---|---|---|")
    lines.append(f"| source | `{a['source']}` | `{b['source']}` |")
    for key in ("device", "default_dtype", "world_size", "seed"):
        if key in a or key in b:
            lines.append(f"| {key.replace('_', ' ')} | {a.get(key, '-')} | {b.get(key, '-')} |")
    if result.a.kind == "probe" or result.b.kind == "probe":
        lines.append(f"| autocast | {_autocast(result.a)} | {_autocast(result.b)} |")
        lines.append(f"| float32 math | {_float32_math(result.a)} | {_float32_math(result.b)} |")
    if "versions" in a or "versions" in b:
        va, vb = a.get("versions", {}), b.get("versions", {})
        lines.append(f"| torch | {va.get('torch', '-')} | {vb.get('torch', '-')} |")
    lines.append("")
    lines.append(f"Tolerance: {result.tolerance.describe()}; failing steps allowed: {result.allow_failing_steps}; "
                 "NaN always fails.")
    lines.append("")
    first = result.first_step
    lines.append(f"**First step out of tolerance:** {first if first is not None else 'none'}")
    lines.append(f"**Max abs error:** {_g(result.max_abs)}  **Max rel error:** {_g(result.max_rel)}")
    lines.append("")
    if result.metrics:
        lines.append("| metric | compared | max abs (rank, step) | max rel (rank, step) | failing steps | first failure |")
        lines.append("|---|---|---|---|---|---|")
        for m in result.metrics.values():
            failing = sorted({s for _, s in m.failing} | {s for _, s in m.nonfinite})
            first_fail = "-" if m.first is None else (
                f"step {m.first['step']} rank {m.first['rank']}: {_g(m.first['a'])} vs {_g(m.first['b'])}")
            lines.append(f"| {m.name} | {m.compared} | {_g(m.max_abs)} {m.max_abs_at or ''} | "
                         f"{_g(m.max_rel)} {m.max_rel_at or ''} | {spans(failing) or '-'} | {first_fail} |")
        lines.append("")
    if result.module_steps_compared:
        failing = sorted({s for per in result.module_failing.values() for s in per}
                         | {s for per in result.module_nonfinite.values() for s in per})
        lines.append(f"Module records: {result.module_entries_compared} entries in {result.module_steps_compared} "
                     f"rank-steps; max abs {_g(result.module_max_abs)}, max rel {_g(result.module_max_rel)}; "
                     f"failing steps: {spans(failing) or 'none'}.")
        lines.append("")
    culprit = result.culprit
    if culprit is not None:
        w = culprit.worst or {}
        lines.append(f"**First culprit:** `{culprit.module}` ({culprit.phase}, step {culprit.step}, rank {culprit.rank}):"
                     f" its inputs agree, its {w.get('entry', 'outputs').split(' ', 2)[-1]} {w.get('stat', '')} is "
                     f"{_g(w.get('a'))} in A and {_g(w.get('b'))} in B (abs {_g(w.get('abs'))}, rel {_g(w.get('rel'))}, "
                     f"{w.get('dtype', '')} {tuple(w.get('shape', ()))}).")
        if culprit.inherited:
            shown = ", ".join(f"`{n}`" for n in culprit.inherited[:8])
            more = f" and {len(culprit.inherited) - 8} more" if len(culprit.inherited) > 8 else ""
            lines.append(f"Inherited the difference (not blamed): {shown}{more}.")
        lines.append("")
    elif result.culprit_note:
        lines.append(f"**First culprit:** none: {result.culprit_note}.")
        lines.append("")
    if result.problems:
        lines.append("**Not in both runs:**")
        lines.extend(f"- {p}" for p in result.problems)
        lines.append("")
    if result.notes:
        lines.append("Notes:")
        lines.extend(f"- {n}" for n in result.notes[:20])
        if len(result.notes) > 20:
            lines.append(f"- ... and {len(result.notes) - 20} more")
        lines.append("")
    return "\n".join(lines)
