"""``--plot FILE.png``: both runs' curves and their difference, one column per metric.

Usage::

    plot.write_png(result, "compare.png")     # needs matplotlib: pip install 'npu-migrate[compare]'

Top row: metric against step for A and B (the lowest rank both have). Bottom row: ``|A - B|``
on a log scale with the tolerance it was held to (dotted); steps out of tolerance are red
crosses and the first one is marked by a vertical line. With module records, a last column
shows, per step, the largest error of any module statistic divided by its tolerance (above 1
is out of tolerance), and names the first culprit below it.
"""

from __future__ import annotations

import math
import os
from typing import Any

from npu_migrate.compare.reading.comparison import Comparison, step_dtypes
from npu_migrate.compare.reading.sources import SourceError

MAX_METRICS = 4


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SourceError("--plot needs matplotlib, which is not installed. Install it with "
                          "pip install 'npu-migrate[compare]' (or pip install matplotlib).") from exc
    return plt


def write_png(result: Comparison, path: str) -> str:
    """Draw the comparison into ``path`` and return the path.

    Raises:
        SourceError: matplotlib is missing, or there is no metric to draw.
    """
    plt = _pyplot()
    names = [m for m in result.metrics if result.metrics[m].compared][:MAX_METRICS]
    rank = result.alignment.ranks[0]
    ratios = result.module_ratio.get(rank, {})
    if not names and not ratios:
        raise SourceError("--plot: the runs share no step metric or module record to draw.")
    from matplotlib.ticker import MaxNLocator

    ra, rb = result.a.ranks[rank], result.b.ranks[rank]
    steps = result.alignment.steps[rank]
    first = result.first_step
    ncols = len(names) + (1 if ratios else 0)
    fig, axes = plt.subplots(2, ncols, figsize=(4.6 * ncols, 6.6), squeeze=False)
    label_a, label_b = _label("A", result.a), _label("B", result.b)
    for col, name in enumerate(names):
        xs, ya, yb, diff, band, bad = [], [], [], [], [], []
        failing = set(result.metrics[name].failing) | set(result.metrics[name].nonfinite)
        for step in steps:
            va, vb = ra.steps.get(step, {}).get(name), rb.steps.get(step, {}).get(name)
            if va is None or vb is None:
                continue
            rtol, atol = result.tolerance.resolve(*step_dtypes(ra, rb, step))
            xs.append(step)
            ya.append(va)
            yb.append(vb)
            d = abs(va - vb) if math.isfinite(va) and math.isfinite(vb) else math.nan
            diff.append(d)
            band.append(atol + rtol * max(abs(va), abs(vb)) if math.isfinite(d) else math.nan)
            if (rank, step) in failing:
                bad.append((step, d))
        marker = "o" if len(xs) <= 30 else None
        top, bottom = axes[0][col], axes[1][col]
        top.plot(xs, ya, label=label_a, color="tab:blue", marker=marker, markersize=3, linewidth=1.8)
        top.plot(xs, yb, label=label_b, color="tab:orange", marker=marker, markersize=3, linewidth=1.2,
                 linestyle="--")
        top.set_title(f"{name} (rank {rank})")
        top.set_ylabel(name)
        positive = [d for d in diff if math.isfinite(d) and d > 0]
        shown = [d if math.isfinite(d) and d > 0 else math.nan for d in diff]
        bottom.plot(xs, shown, color="tab:green", marker=marker, markersize=3, label="|A - B|")
        if any(b > 0 for b in band if math.isfinite(b)):
            bottom.plot(xs, band, color="gray", linestyle=":", label="tolerance")
        floor = min(positive + [b for b in band if math.isfinite(b) and b > 0] or [1e-12])
        if bad:
            bottom.scatter([s for s, _ in bad], [d if math.isfinite(d) and d > 0 else floor for _, d in bad],
                           color="red", marker="x", s=45, zorder=3, label="out of tolerance")
        equal = sum(1 for d in diff if d == 0)
        if equal:
            bottom.text(0.02, 0.04, f"A == B at {equal} of {len(diff)} steps (not drawn: log scale)",
                        transform=bottom.transAxes, fontsize=8, color="tab:green")
        bottom.set_yscale("log")
        bottom.set_ylabel(f"|A - B| of {name}")
        _finish(top, bottom, first, result)
        if col == 0:
            top.legend(fontsize=8, loc="best")
            bottom.legend(fontsize=8, loc="best")
    if ratios:
        top, bottom = axes[0][-1], axes[1][-1]
        xs = sorted(ratios)
        ys = [ratios[s] for s in xs]
        finite = [y for y in ys if math.isfinite(y) and y > 0]
        cap = max(finite + [1.0]) * 10
        top.plot(xs, [y if math.isfinite(y) and y > 0 else math.nan for y in ys], color="tab:purple",
                 marker="o" if len(xs) <= 30 else None, markersize=3, label="worst module statistic")
        over = [(s, y if math.isfinite(y) else cap) for s, y in zip(xs, ys) if y > 1]
        if over:
            top.scatter([s for s, _ in over], [y for _, y in over], color="red", marker="x", s=45, zorder=3,
                        label="out of tolerance")
        top.axhline(1.0, color="gray", linestyle=":", label="tolerance")
        top.set_yscale("log")
        top.set_title(f"module records (rank {rank})")
        top.set_ylabel("max error / tolerance")
        top.legend(fontsize=8, loc="best")
        _finish(top, None, first, result)
        bottom.axis("off")
        bottom.text(0.0, 1.0, _culprit_text(result), va="top", ha="left", fontsize=9, wrap=True,
                    transform=bottom.transAxes, family="monospace")
    verdict = "PASS" if result.passed else "DIVERGED"
    fig.suptitle(f"npu-migrate compare: {verdict}   tolerance: {result.tolerance.describe()}", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(side: str, run: Any) -> str:
    header = run.header
    autocast = sorted({d for rec in run.ranks.values() for d in rec.autocast.values()})
    what = header.get("device", run.kind)
    if autocast:
        what += f" {'/'.join(autocast)} autocast"
    return f"{side}: {what} ({os.path.basename(run.source.rstrip('/'))})"


def _finish(top: Any, bottom: Any, first: int | None, result: Comparison) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in (top, bottom):
        if ax is None:
            continue
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step" if result.a.kind != "metrics" else str(result.a.header.get("step_key", "step")))
        if first is not None:
            ax.axvline(first, color="red", alpha=0.5, linewidth=1)
    if first is not None:
        top.annotate(f"first out of tolerance: step {first}", xy=(first, 1.0), xycoords=("data", "axes fraction"),
                     xytext=(3, -12), textcoords="offset points", color="red", fontsize=8)


def _culprit_text(result: Comparison) -> str:
    c = result.culprit
    if c is None:
        if result.culprit_note:
            return "First culprit: none.\n" + "\n".join(_wrap(result.culprit_note))
        return "Every module record is\nwithin tolerance."
    w = c.worst or {}
    lines = [f"First culprit: {c.module}", f"  {c.phase}, step {c.step}, rank {c.rank}",
             f"  inputs agree; {w.get('entry', '').split(' ', 2)[-1]} {w.get('stat', '')}:",
             f"  A {w.get('a', float('nan')):.6g}", f"  B {w.get('b', float('nan')):.6g}",
             f"  rel error {w.get('rel', float('nan')):.3g}"]
    if c.inherited:
        shown = ", ".join(c.inherited[:6]) + (" ..." if len(c.inherited) > 6 else "")
        lines.append("Inherited (not blamed):")
        lines.extend("  " + part for part in _wrap(shown))
    return "\n".join(lines)


def _wrap(text: str, width: int = 44) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]
