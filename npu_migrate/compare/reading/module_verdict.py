"""Judging module records: each entry's closeness, all steps of one layout at once, and the first culprit.

Usage::

    from npu_migrate.compare.reading.module_verdict import compare_modules

    compare_modules(result)     # fills result.module_* and result.culprit of a verdict.Comparison

The rules are :mod:`npu_migrate.compare.reading.verdict`'s (its docstring). Steps whose layouts pair the
same way (:func:`npu_migrate.compare.reading.align.pair_entries`) are checked together, ``_CHUNK`` steps at
a time, with numpy where it is installed (the ``[compare]`` extra) and in plain Python otherwise;
in the first failing step, :func:`_find_culprit` walks the modules in forward, then backward order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from npu_migrate.compare.reading import align as _align
from npu_migrate.compare.reading.comparison import Comparison, Culprit, step_dtypes
from npu_migrate.compare.records import NSTATS, STAT_FIELDS, Entry, RankRecording, decode_stats
from npu_migrate.compare.reading.tolerance import is_close

_CHUNK = 1024  # steps checked at once

try:  # optional: vectorised module-record checks
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is missing
    _np = None


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


def compare_modules(result: Comparison) -> None:
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
            dtypes = step_dtypes(ra, rb, step)
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
    dtypes = step_dtypes(ra, rb, step)
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
