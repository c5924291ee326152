"""The result of comparing two runs: per-metric summaries, module-record findings, the culprit, the verdict.

Usage::

    result = verdict.compare("runs/gpu", "runs/npu")          # a Comparison
    result.passed, result.exit_code, result.first_step, result.problems
    result.metrics["loss"].max_rel, result.culprit.module

:class:`Comparison` is filled by :mod:`npu_migrate.compare.reading.verdict` (step metrics) and
:mod:`npu_migrate.compare.reading.module_verdict` (module records), and read by the report and the plot;
what passes is decided by its properties, from what they found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from npu_migrate.compare.reading import align as _align
from npu_migrate.compare.records import RankRecording
from npu_migrate.compare.reading.sources import Run
from npu_migrate.compare.reading.tolerance import Tolerance


def step_dtypes(ra: RankRecording, rb: RankRecording, step: int) -> tuple[str | None, ...]:
    """What a step's tolerance depends on: each side's autocast dtype and float32 math that step, and default dtype."""
    return (ra.autocast.get(step), rb.autocast.get(step), ra.float32_math.get(step), rb.float32_math.get(step),
            ra.header.get("default_dtype"), rb.header.get("default_dtype"))


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
