"""The summary of a profiled job, read from the ranks' ``rank{R}.profile.json`` files; no torch.

Usage::

    from npu_migrate.profile import summary
    lines, failed = summary.lines(settings)   # after the job: one line per rank, the slowest rank
    for line in lines: say(line)

Each profiled rank writes its file when it stops profiling (:mod:`.recorder`); only the files of
this job (its token, :attr:`.settings.ProfileSettings.job`) are read, so an earlier job's files in
the same directory are left alone and not counted.
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
from typing import Any

from npu_migrate.profile.settings import ProfileSettings

SHOWN_OPERATORS = 3
"""Operators named on each rank's line (the file keeps more)."""


def read(settings: ProfileSettings) -> dict[int, dict[str, Any]]:
    """``{rank: summary}`` of this job's ranks in ``settings.directory``."""
    found: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(glob.escape(settings.directory), "rank*.profile.json")):
        if not re.fullmatch(r"rank\d+\.profile\.json", os.path.basename(path)):
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("job") == settings.job and isinstance(data.get("rank"), int):
            found[data["rank"]] = data
    return dict(sorted(found.items()))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def step_time(data: dict[str, Any]) -> float | None:
    """A rank's median step time in seconds (None without a finished profiled step)."""
    times = [float(t) for t in data.get("step_times_s") or []]
    return statistics.median(times) if times else None


def _script_profiler(yielded: list[Any]) -> str:
    step, how = yielded  # how: "was recording" or "started" (recorder.StepProfiler.close)
    return f"the script's own profiler {how} at step {step}"


def rank_line(data: dict[str, Any]) -> str:
    """``rank 0: 12.3 ms/step (steps 3-5), self time (cpu) per step: aten::addmm 4.1 ms, ...; trace: FILE``."""
    steps = data.get("steps") or []
    yielded = data.get("yielded")
    if yielded and not steps:
        return (f"rank {data['rank']}: not profiled: {_script_profiler(yielded)} (a process runs one profiler "
                f"at a time; choose --profile-steps outside the script's)")
    median = step_time(data)
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}" if steps else "no step"
    head = f"rank {data['rank']}: " + (f"{_ms(median)}/step (median of {span})" if median is not None else span)
    top = data.get("top") or []
    if top:
        ops = ", ".join(f"{name} {_ms(float(us) * 1e-6)}" for name, us, *_ in top[:SHOWN_OPERATORS])
        head += f"; top self time ({data.get('self_time', 'cpu')}) per step: {ops}"
    if data.get("trace"):
        head += f"; trace {data['trace']}"
    if yielded:
        head += f"; stopped there: {_script_profiler(yielded)}"
    return head


def lines(settings: ProfileSettings) -> tuple[list[str], bool]:
    """The lines that end a profiled job, and whether nothing at all was profiled."""
    ranks = read(settings)
    where = settings.directory
    if not ranks:
        return [f"--profile {where}: no rank profiled {settings.describe()}: the job ended before it (check "
                f"--profile-steps and --profile-ranks)"], True
    out = [f"profile of {settings.describe()} in {where} (open it with `tensorboard --logdir {where}` or "
           f"ui.perfetto.dev):"]
    out += [rank_line(data) for data in ranks.values()]
    timed = {rank: step_time(data) for rank, data in ranks.items() if step_time(data) is not None}
    if len(timed) > 1:
        slowest = max(timed, key=lambda r: timed[r])  # type: ignore[arg-type,return-value]
        fastest = min(timed.values())  # type: ignore[type-var]
        ratio = timed[slowest] / fastest if fastest else 1.0  # type: ignore[operator]
        out.append(f"slowest rank: {slowest} ({_ms(timed[slowest])}/step, {ratio:.2f}x the fastest)")  # type: ignore[arg-type]
    return out, False
