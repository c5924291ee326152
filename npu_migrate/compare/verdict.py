"""Judging two runs: the first step out of tolerance, the largest errors, and the first culprit module.

Usage::

    result = verdict.compare("runs/gpu", "runs/npu", Tolerance(), allow_failing_steps=2)
    result.passed, result.first_step, result.culprit, result.metrics["loss"].max_rel

Rules:

* Every metric of every common rank and step must be close (:mod:`~npu_migrate.compare.tolerance`).
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
from dataclasses import dataclass, field
from typing import Any, Sequence

from npu_migrate.compare import align as _align
from npu_migrate.compare.records import NSTATS, STAT_FIELDS, Entry, RankRecording, decode_stats
from npu_migrate.compare.settings import StepRange
from npu_migrate.compare.sources import Run, SourceError, load_run
from npu_migrate.compare.tolerance import Tolerance, errors, is_close

_CHUNK = 1024  # steps checked at once

try:  # optional: vectorised module-record checks
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is missing
    _np = None


@dataclass
class MetricSummary:
    """How one step metric compared over every common rank and step."""

    name: str
    compared: int = 0
    max_abs: float = 0.0
    max_abs_at: tuple[int, int] | None = None  # (rank, step)
    max_rel: float = 0.0
    max_rel_at: tuple[int, int] | None = None
    failing: list[tuple[int, int]] = field(default_factory=list)  # (rank, step)
    nonfinite: list[tuple[int, int]] = field(default_factory=list)
    first: dict[str, Any] | None = None  # the first failure: rank, step, a, b, rtol, atol


@dataclass
class Culprit:
    """The first module that turned close inputs into differing outputs.

    Attributes:
        rank: the rank where it was found.
        step: the first step whose module records differ on that rank.
        module: module name (with ``#call`` for a later call in the step).
        phase: ``forward`` or ``backward``.
        worst: the output entry that differs most: label, stat, A, B, abs and rel error.
        inherited: modules after it whose inputs already differed (not blamed).
    """

    rank: int
    step: int
    module: str
    phase: str
    worst: dict[str, Any]
    inherited: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """Everything ``npu-migrate compare`` reports."""

    a: Run
    b: Run
    tolerance: Tolerance
    allow_failing_steps: int
    alignment: _align.Alignment
    metrics: dict[str, MetricSummary] = field(default_factory=dict)
    module_steps_compared: int = 0
    module_entries_compared: int = 0
    module_max_abs: float = 0.0
    module_max_rel: float = 0.0
    module_failing: dict[int, list[int]] = field(default_factory=dict)  # rank -> steps
    module_nonfinite: dict[int, list[int]] = field(default_factory=dict)
    module_first: dict[str, Any] | None = None  # first differing entry of the first failing step
    module_ratio: dict[int, dict[int, float]] = field(default_factory=dict)  # rank -> step -> max error/tolerance
    culprit: Culprit | None = None
    culprit_note: str | None = None
    only_a_entries: list[str] = field(default_factory=list)
    only_b_entries: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # -- derived

    @property
    def failing_steps(self) -> list[int]:
        """Steps (any rank) where a metric or a module record is out of tolerance."""
        steps = {s for m in self.metrics.values() for _, s in m.failing}
        steps.update(s for per in self.module_failing.values() for s in per)
        return sorted(steps)

    @property
    def nonfinite_steps(self) -> list[int]:
        """Steps (any rank) with NaN or Inf on either side: these always fail."""
        steps = {s for m in self.metrics.values() for _, s in m.nonfinite}
        steps.update(s for per in self.module_nonfinite.values() for s in per)
        return sorted(steps)

    @property
    def first_step(self) -> int | None:
        """The first step out of tolerance (NaN included), or ``None``."""
        steps = set(self.failing_steps) | set(self.nonfinite_steps)
        return min(steps) if steps else None

    @property
    def problems(self) -> list[str]:
        """What one run has and the other lacks (each fails the comparison)."""
        al = self.alignment
        out = []
        if al.only_a_ranks:
            out.append(f"rank(s) {_align.spans(al.only_a_ranks)} only in A ({self.a.source}): B is missing them")
        if al.only_b_ranks:
            out.append(f"rank(s) {_align.spans(al.only_b_ranks)} only in B ({self.b.source}): A is missing them")
        for rank, steps in al.only_a_steps.items():
            out.append(f"rank {rank}: step(s) {_align.spans(steps)} only in A")
        for rank, steps in al.only_b_steps.items():
            out.append(f"rank {rank}: step(s) {_align.spans(steps)} only in B")
        if self.only_a_entries:
            out.append(f"module record(s) only in A: {', '.join(self.only_a_entries[:5])}"
                       + (f" and {len(self.only_a_entries) - 5} more" if len(self.only_a_entries) > 5 else ""))
        if self.only_b_entries:
            out.append(f"module record(s) only in B: {', '.join(self.only_b_entries[:5])}"
                       + (f" and {len(self.only_b_entries) - 5} more" if len(self.only_b_entries) > 5 else ""))
        return out

    @property
    def within_budget(self) -> bool:
        """No NaN, and no more failing steps than allowed."""
        return not self.nonfinite_steps and len(self.failing_steps) <= self.allow_failing_steps

    @property
    def passed(self) -> bool:
        """Within tolerance (and budget), with nothing missing on either side."""
        return self.within_budget and not self.problems

    @property
    def exit_code(self) -> int:
        """0 within tolerance, 1 diverged."""
        return 0 if self.passed else 1

    @property
    def max_abs(self) -> float:
        return max([m.max_abs for m in self.metrics.values()] + [self.module_max_abs])

    @property
    def max_rel(self) -> float:
        return max([m.max_rel for m in self.metrics.values()] + [self.module_max_rel])


# ---------------------------------------------------------------------------------------------- entry


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
        _compare_modules(result)
    return result


def _step_dtypes(ra: RankRecording, rb: RankRecording, step: int) -> tuple[str | None, ...]:
    return (ra.autocast.get(step), rb.autocast.get(step), ra.header.get("default_dtype"), rb.header.get("default_dtype"))


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
                rtol, atol = tol.resolve(*_step_dtypes(ra, rb, step))
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


# ---------------------------------------------------------------------------------------------- modules


@dataclass
class _Pairing:
    """How one layout of A lines up with one layout of B, and each pair's tolerance."""

    pairs: list[tuple[int, int]]
    only_a: list[Entry]
    only_b: list[Entry]
    entries: list[Entry]  # A's entry of each pair


def _check_rows(xa: Sequence[float], xb: Sequence[float], rtol: float,
                atol: float) -> tuple[bool, bool, float, float, str, float]:
    """One entry's six statistics: (close, NaN-free, abs error, rel error, worst stat, max error/tolerance)."""
    clean = xa[4] == 0 and xb[4] == 0 and not any(v != v for v in xa[:4]) and not any(v != v for v in xb[:4])
    scale = max(abs(xa[0]), abs(xa[1]), abs(xb[0]), abs(xb[1]))
    close = clean and xa[5] == xb[5]
    worst_abs, worst_rel, worst, ratio = 0.0, 0.0, STAT_FIELDS[0], 0.0 if clean else math.inf
    for k in range(4):
        s = max(abs(xa[3]), abs(xb[3])) if k == 3 else scale
        if xa[k] == xb[k]:
            continue
        if not is_close(xa[k], xb[k], rtol, atol, s):
            close = False
        d = abs(xa[k] - xb[k])
        bound = atol + rtol * s
        ratio = max(ratio, d / bound if bound else math.inf) if d == d else math.inf
        r = d / s if s and d == d else math.inf
        if r > worst_rel or (d != d and worst_rel == 0.0):
            worst_abs, worst_rel, worst = d, r, STAT_FIELDS[k]
    return close, clean, worst_abs, worst_rel, worst, ratio


def _compare_modules(result: Comparison) -> None:
    tol = result.tolerance
    pairings: dict[tuple[int, int], _Pairing] = {}
    only_a: dict[str, None] = {}
    only_b: dict[str, None] = {}
    first_fail: tuple[int, int] | None = None  # (step, rank)
    for rank in result.alignment.ranks:
        ra, rb = result.a.ranks[rank], result.b.ranks[rank]
        steps = [s for s in result.alignment.steps[rank] if s in ra.modules and s in rb.modules]
        for step in result.alignment.steps[rank]:
            if (step in ra.modules) != (step in rb.modules):
                side = "A" if step in ra.modules else "B"
                result.notes.append(f"rank {rank} step {step}: module records only in {side}")
        failing: list[int] = []
        nonfinite: list[int] = []
        # group steps whose layouts pair the same way, and check each group at once
        groups: dict[tuple[int, int, tuple], list[int]] = {}
        for step in steps:
            ea, eb = ra.modules[step][0], rb.modules[step][0]
            key = (id(ea), id(eb))
            pairing = pairings.get(key)
            if pairing is None:
                pairs, oa, ob = _align.pair_entries(ea, eb)
                pairing = pairings[key] = _Pairing(pairs, oa, ob, [ea[i] for i, _ in pairs])
                only_a.update(dict.fromkeys(e.label for e in oa))
                only_b.update(dict.fromkeys(e.label for e in ob))
            dtypes = _step_dtypes(ra, rb, step)
            groups.setdefault((key[0], key[1], dtypes), []).append(step)
        for (ka, kb, dtypes), group in groups.items():
            pairing = pairings[(ka, kb)]
            if not pairing.pairs:
                continue
            entries_b = rb.modules[group[0]][0]
            tols = [tol.resolve(e.dtype, entries_b[j].dtype, *dtypes) for e, (_, j) in zip(pairing.entries, pairing.pairs)]
            for start in range(0, len(group), _CHUNK):  # bounded memory for long recordings
                bad, nan, abs_err, rel_err, ratios = _check_group(ra, rb, group[start:start + _CHUNK], pairing, tols)
                result.module_ratio.setdefault(rank, {}).update(ratios)
                result.module_max_abs = max(result.module_max_abs, abs_err)
                result.module_max_rel = max(result.module_max_rel, rel_err)
                nonfinite.extend(nan)
                failing.extend(s for s in bad if s not in nan)
                for s in sorted(set(bad) | set(nan))[:1]:
                    if first_fail is None or (s, rank) < first_fail:
                        first_fail = (s, rank)
            result.module_steps_compared += len(group)
            result.module_entries_compared += len(group) * len(pairing.pairs)
        if failing:
            result.module_failing[rank] = sorted(failing)
        if nonfinite:
            result.module_nonfinite[rank] = sorted(nonfinite)
    result.only_a_entries = list(only_a)
    result.only_b_entries = list(only_b)
    if first_fail is not None:
        _find_culprit(result, first_fail[1], first_fail[0], pairings)


def _check_group(ra: RankRecording, rb: RankRecording, steps: list[int], pairing: _Pairing,
                 tols: list[tuple[float, float]]) -> tuple[list[int], list[int], float, float, dict[int, float]]:
    """Steps of one layout pairing: (failing steps, NaN steps, max abs error, max rel error, {step: error/tolerance})."""
    ia = [i for i, _ in pairing.pairs]
    ib = [j for _, j in pairing.pairs]
    identity = ia == list(range(len(ra.modules[steps[0]][0]))) and ib == list(range(len(rb.modules[steps[0]][0])))
    if _np is not None:
        A = _np.frombuffer(b"".join(ra.modules[s][1] for s in steps), dtype="<f8").reshape(len(steps), -1, NSTATS)
        B = _np.frombuffer(b"".join(rb.modules[s][1] for s in steps), dtype="<f8").reshape(len(steps), -1, NSTATS)
        if not identity:
            A, B = A[:, ia, :], B[:, ib, :]
        rtol = _np.array([t[0] for t in tols])[None, :]
        atol = _np.array([t[1] for t in tols])[None, :]
        with _np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            scale = _np.maximum(_np.maximum(abs(A[..., 0]), abs(A[..., 1])), _np.maximum(abs(B[..., 0]), abs(B[..., 1])))
            nscale = _np.maximum(abs(A[..., 3]), abs(B[..., 3]))
            diff = abs(A[..., :4] - B[..., :4])
            same = A[..., :4] == B[..., :4]
            diff = _np.where(same, 0.0, diff)
            scales = _np.stack([scale, scale, scale, nscale], axis=-1)
            nan = (A[..., 4] > 0) | (B[..., 4] > 0) | _np.isnan(A[..., :4]).any(-1) | _np.isnan(B[..., :4]).any(-1)
            ok = (same | (diff <= atol[..., None] + rtol[..., None] * scales)).all(-1) & (A[..., 5] == B[..., 5]) & ~nan
            rel = _np.where(diff == 0, 0.0, diff / scales)
            ratio = _np.where(diff == 0, 0.0, diff / (atol[..., None] + rtol[..., None] * scales))
            ratio = _np.where(_np.isnan(ratio) | nan[..., None], _np.inf, ratio).max(axis=(1, 2))
        bad_steps = [steps[k] for k in _np.nonzero(~ok.all(-1))[0]]
        nan_steps = [steps[k] for k in _np.nonzero(nan.any(-1))[0]]
        fin = _np.isfinite(diff)
        abs_err = float(diff[fin].max()) if fin.any() else 0.0
        finr = _np.isfinite(rel)
        rel_err = float(rel[finr].max()) if finr.any() else 0.0
        return bad_steps, nan_steps, abs_err, rel_err, {s: float(r) for s, r in zip(steps, ratio)}
    bad_steps, nan_steps, abs_err, rel_err = [], [], 0.0, 0.0
    ratios: dict[int, float] = {}
    for s in steps:
        raw_a, raw_b = ra.modules[s][1], rb.modules[s][1]
        xa, xb = decode_stats(raw_a), decode_stats(raw_b)
        same_bytes = identity and raw_a == raw_b
        bad = nan = False
        worst = 0.0
        for (i, j), (rtol, atol) in zip(pairing.pairs, tols):
            row_a, row_b = xa[i * NSTATS:(i + 1) * NSTATS], xb[j * NSTATS:(j + 1) * NSTATS]
            if same_bytes:
                clean = row_a[4] == 0 and not any(v != v for v in row_a[:4])
                bad, nan = bad or not clean, nan or not clean
                worst = worst if clean else math.inf
                continue
            close, finite, d, r, _, ratio = _check_rows(row_a, row_b, rtol, atol)
            bad, nan = bad or not close, nan or not finite
            worst = max(worst, ratio)
            if math.isfinite(d):
                abs_err = max(abs_err, d)
            if math.isfinite(r):
                rel_err = max(rel_err, r)
        if bad:
            bad_steps.append(s)
        if nan:
            nan_steps.append(s)
        ratios[s] = worst
    return bad_steps, nan_steps, abs_err, rel_err, ratios


def _is_input(entry: Entry) -> bool:
    """Whether an entry is something a module receives (inputs forward, output gradients backward)."""
    return entry.slot.startswith("input") if entry.phase == "forward" else entry.slot.startswith("grad_output")


def _find_culprit(result: Comparison, rank: int, step: int, pairings: dict[tuple[int, int], _Pairing]) -> None:
    ra, rb = result.a.ranks[rank], result.b.ranks[rank]
    ea, eb = ra.modules[step][0], rb.modules[step][0]
    pairing = pairings[(id(ea), id(eb))]
    xa, xb = decode_stats(ra.modules[step][1]), decode_stats(rb.modules[step][1])
    dtypes = _step_dtypes(ra, rb, step)
    # (module, call, phase) -> [inputs close, outputs close, worst output]
    groups: dict[tuple[str, int, str], dict[str, Any]] = {}
    order: list[tuple[str, int, str]] = []
    first_entry: dict[str, Any] | None = None
    for i, j in pairing.pairs:
        e = ea[i]
        rtol, atol = result.tolerance.resolve(e.dtype, eb[j].dtype, *dtypes)
        row_a, row_b = list(xa[i * NSTATS:(i + 1) * NSTATS]), list(xb[j * NSTATS:(j + 1) * NSTATS])
        close, _, d, r, stat, _ = _check_rows(row_a, row_b, rtol, atol)
        key = (e.module, e.call, e.phase)
        if key not in groups:
            groups[key] = {"inputs": True, "outputs": True, "worst": None, "has_outputs": False}
            order.append(key)
        g = groups[key]
        detail = {"entry": e.label, "stat": stat, "a": row_a[STAT_FIELDS.index(stat)],
                  "b": row_b[STAT_FIELDS.index(stat)], "abs": d, "rel": r, "rtol": rtol, "atol": atol,
                  "dtype": e.dtype, "shape": list(e.shape)}
        if not close and first_entry is None:
            first_entry = dict(detail, rank=rank, step=step)
        if _is_input(e):
            g["inputs"] = g["inputs"] and close
        else:
            g["has_outputs"] = True
            if not close:
                g["outputs"] = False
                if g["worst"] is None or (r == r and r > g["worst"]["rel"]):
                    g["worst"] = detail
    result.module_first = first_entry
    ordered = [k for k in order if k[2] == "forward"] + [k for k in order if k[2] == "backward"]
    culprit: Culprit | None = None
    inherited: list[str] = []
    for key in ordered:
        g = groups[key]
        if g["outputs"]:
            continue
        name = f"{key[0]}#{key[1]}" if key[1] else key[0]
        if g["inputs"] and culprit is None:
            culprit = Culprit(rank, step, name, key[2], g["worst"])
        elif culprit is not None or not g["inputs"]:
            if culprit is not None and key[2] == culprit.phase:
                inherited.append(name)
    if culprit is not None:
        culprit.inherited = inherited
        result.culprit = culprit
    elif first_entry is not None:
        result.culprit_note = (f"no module turned close inputs into differing outputs in step {step} on rank {rank}: "
                               f"the first difference, {first_entry['entry']}, is already in what the first "
                               "recorded module received (data, or code outside any recorded module)")
