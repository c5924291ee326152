"""Judging two runs: the first step out of tolerance, the largest errors, and the first culprit module.

Usage::

    result = verdict.compare("runs/gpu", "runs/npu", Tolerance(), allow_failing_steps=2)
    result.passed, result.first_step, result.culprit, result.metrics["loss"].max_rel

Rules:

* Every metric of every common rank and step must be close (:mod:`~npu_migrate.compare.reading.tolerance`).
  Up to ``allow_failing_steps`` steps may fail (Megatron's golden values allow a few); a NaN or
  Inf never passes and never counts against that budget.
* A module-record entry is close when its NaN and Inf counts are equal and zero, and its min,
  max and mean are within tolerance of the tensor's magnitude (``max(|min|, |max|)`` of both
  runs) and its L2 norm within tolerance of itself.
* In the first step whose module records differ, modules are visited in forward order (the order
  they finished), then in backward order. The first culprit is the first module whose inputs are
  all close but whose outputs are not (in backward: whose incoming gradients are close but
  whose gradients for its inputs or parameters are not). A module whose inputs already differ
  only inherited the error and is not blamed.
* Ranks, steps or module entries that one run has and the other lacks fail the comparison
  (restrict it with ``steps``); metrics that only one side has are only noted.

numpy (in the ``[compare]`` extra) makes module records fast: all steps of one layout are
checked at once. Without it the same rules run in plain Python.
"""

from __future__ import annotations

import math
from typing import Sequence

from npu_migrate.compare.reading import align as _align
from npu_migrate.compare.reading.comparison import Comparison, Culprit, MetricSummary, step_dtypes
from npu_migrate.compare.reading.module_verdict import compare_modules
from npu_migrate.compare.recording.settings import StepRange
from npu_migrate.compare.reading.sources import Run, SourceError, load_run
from npu_migrate.compare.reading.tolerance import Tolerance, errors, is_close

__all__ = ["Comparison", "Culprit", "MetricSummary", "compare"]


def compare(a: str | Run, b: str | Run, tolerance: Tolerance | None = None, *, allow_failing_steps: int = 0,
            steps: StepRange | str | None = None, metrics: Sequence[str] | None = None,
            pattern: str | None = None) -> Comparison:
    """Compare run ``a`` with run ``b`` (paths or loaded :class:`Run` objects).

    Args:
        tolerance: how close is close (default: dtype-aware).
        allow_failing_steps: how many steps may be out of tolerance (NaN never may).
        steps: compare only these steps, e.g. ``"1:100"``.
        metrics: compare only these step metrics.
        pattern: regular expression for plain-log inputs (see :func:`sources.load_run`).

    Raises:
        SourceError: an input cannot be read, or the two runs have nothing in common.
    """
    tolerance = tolerance or Tolerance()
    if allow_failing_steps < 0:
        raise SourceError(f"--allow-failing-steps {allow_failing_steps} is negative; pass 0 or more.")
    if not isinstance(steps, StepRange):
        steps = StepRange.parse(steps, "--steps")
    run_a = a if isinstance(a, Run) else load_run(a, pattern, list(metrics) if metrics else None)
    run_b = b if isinstance(b, Run) else load_run(b, pattern, list(metrics) if metrics else None)
    al = _align.align(run_a, run_b, steps, metrics)
    result = Comparison(run_a, run_b, tolerance, allow_failing_steps, al)
    result.notes.extend(f"A: {n}" for n in run_a.notes)
    result.notes.extend(f"B: {n}" for n in run_b.notes)
    for m in al.only_a_metrics:
        result.notes.append(f"metric {m!r} only in A; not compared")
    for m in al.only_b_metrics:
        result.notes.append(f"metric {m!r} only in B; not compared")
    has_modules = any(run_a.ranks[r].modules and run_b.ranks[r].modules for r in al.ranks)
    if not al.ranks:
        raise SourceError(f"A ({run_a.source}) has rank(s) {_align.spans(run_a.ranks)} and B ({run_b.source}) "
                          f"rank(s) {_align.spans(run_b.ranks)}: no rank in common, nothing to compare.")
    if not al.metrics and not has_modules:
        raise SourceError(f"A ({', '.join(run_a.metrics()) or 'no metrics'}) and B "
                          f"({', '.join(run_b.metrics()) or 'no metrics'}) have no metric in common"
                          + (f" among --metric {', '.join(metrics)}" if metrics else "") + ": nothing to compare.")
    if not any(al.steps.values()):
        raise SourceError(f"A and B have no step in common (range {steps}): nothing to compare. Check that both "
                          "number steps the same way, or pass --steps.")
    _compare_metrics(result)
    if has_modules:
        compare_modules(result)
    return result


def _compare_metrics(result: Comparison) -> None:
    tol = result.tolerance
    for name in result.alignment.metrics:
        summary = result.metrics[name] = MetricSummary(name)
        for rank in result.alignment.ranks:
            ra, rb = result.a.ranks[rank], result.b.ranks[rank]
            for step in result.alignment.steps[rank]:
                va, vb = ra.steps.get(step, {}).get(name), rb.steps.get(step, {}).get(name)
                if va is None or vb is None:
                    continue
                summary.compared += 1
                rtol, atol = tol.resolve(*step_dtypes(ra, rb, step))
                abs_err, rel_err = errors(va, vb)
                finite = math.isfinite(va) and math.isfinite(vb)
                if not finite:
                    summary.nonfinite.append((rank, step))
                elif not is_close(va, vb, rtol, atol):
                    summary.failing.append((rank, step))
                if (not finite or not is_close(va, vb, rtol, atol)) and (
                        summary.first is None or step < summary.first["step"]):
                    summary.first = {"rank": rank, "step": step, "a": va, "b": vb, "abs": abs_err, "rel": rel_err,
                                     "rtol": rtol, "atol": atol}
                if finite:
                    if abs_err > summary.max_abs:
                        summary.max_abs, summary.max_abs_at = abs_err, (rank, step)
                    if rel_err > summary.max_rel:
                        summary.max_rel, summary.max_rel_at = rel_err, (rank, step)
