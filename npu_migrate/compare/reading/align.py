"""Lining two runs up by name: ranks, steps, metrics and module-record entries, and what only one side has.

Usage::

    al = align.align(run_a, run_b, steps=StepRange(1, 100))
    al.ranks, al.steps[0], al.missing_steps, al.metrics
    pairs, only_a, only_b = align.pair_entries(entries_a, entries_b)

Nothing is matched by position: steps by their number, metrics by their name, module entries
by ``(module, call, phase, slot)``. Whatever one side has and the other lacks is listed, so a
report can say "steps 9-10 only in A" instead of comparing step 9 of one run with step 10 of
the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from npu_migrate.compare.records import Entry
from npu_migrate.compare.recording.settings import StepRange
from npu_migrate.compare.reading.sources import Run


@dataclass
class Alignment:
    """What the two runs have in common, and what only one has.

    Attributes:
        ranks: ranks in both.
        only_a_ranks: ranks only A recorded (B lacks them), and ``only_b_ranks`` the reverse.
        steps: ``{rank: steps in both}`` (within the requested range).
        only_a_steps: ``{rank: steps only in A}``, and ``only_b_steps`` the reverse.
        metrics: step metrics both runs have.
        only_a_metrics: metrics only in A, and ``only_b_metrics`` the reverse.
    """

    ranks: list[int] = field(default_factory=list)
    only_a_ranks: list[int] = field(default_factory=list)
    only_b_ranks: list[int] = field(default_factory=list)
    steps: dict[int, list[int]] = field(default_factory=dict)
    only_a_steps: dict[int, list[int]] = field(default_factory=dict)
    only_b_steps: dict[int, list[int]] = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    only_a_metrics: list[str] = field(default_factory=list)
    only_b_metrics: list[str] = field(default_factory=list)


def align(a: Run, b: Run, steps: StepRange = StepRange(), metrics: Sequence[str] | None = None) -> Alignment:
    """Pair ranks, steps and metrics of ``a`` and ``b`` by name.

    Args:
        steps: compare only these steps.
        metrics: compare only these metrics (default: every metric both have).
    """
    al = Alignment()
    al.ranks = sorted(set(a.ranks) & set(b.ranks))
    al.only_a_ranks = sorted(set(a.ranks) - set(b.ranks))
    al.only_b_ranks = sorted(set(b.ranks) - set(a.ranks))
    for rank in al.ranks:
        sa = {s for s in set(a.ranks[rank].steps) | set(a.ranks[rank].modules) if s in steps}
        sb = {s for s in set(b.ranks[rank].steps) | set(b.ranks[rank].modules) if s in steps}
        al.steps[rank] = sorted(sa & sb)
        if sa - sb:
            al.only_a_steps[rank] = sorted(sa - sb)
        if sb - sa:
            al.only_b_steps[rank] = sorted(sb - sa)
    names_a, names_b = a.metrics(), b.metrics()
    if metrics is not None:
        names_a = [m for m in names_a if m in metrics]
        names_b = [m for m in names_b if m in metrics]
    al.metrics = [m for m in names_a if m in names_b]
    al.only_a_metrics = [m for m in names_a if m not in names_b]
    al.only_b_metrics = [m for m in names_b if m not in names_a]
    return al


def pair_entries(ea: Sequence[Entry], eb: Sequence[Entry]) -> tuple[list[tuple[int, int]], list[Entry], list[Entry]]:
    """Pair two steps' module entries by ``(module, call, phase, slot)``.

    Returns:
        ``(pairs, only_a, only_b)``: index pairs in A's order, and the entries one side lacks.
    """
    where_b = {e.key: j for j, e in enumerate(eb)}
    pairs = []
    only_a = []
    for i, e in enumerate(ea):
        j = where_b.pop(e.key, None)
        if j is None:
            only_a.append(e)
        else:
            pairs.append((i, j))
    only_b = [eb[j] for j in sorted(where_b.values())]
    return pairs, only_a, only_b


def spans(numbers: Iterable[int]) -> str:
    """``1-3, 7, 9-10`` for ``[1, 2, 3, 7, 9, 10]``."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(numbers):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [n]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(out)
