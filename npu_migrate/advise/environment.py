"""The environment variables that change an NPU job's speed: what to set, why, the trade-off, what is set now.

Usage::

    from npu_migrate.advise import environment

    changes, good = environment.check(os.environ)
    changes[0]   # {"name": "TASK_QUEUE_ENABLE", "value": "2", "current": None, "why": "...", "trade_off": "..."}

The rules follow msprof-analyze's ``environment_variable_checker.py`` and torch-npu's documentation
of these variables. The variables are read from this process's environment: the one the script
would be launched with. A variable already set to what is advised is listed as good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class Rule:
    """One variable: the advised value, when the current one needs changing, why, and the trade-off."""

    name: str
    value: str
    needs_change: Callable[[str | None], bool]
    why: str
    trade_off: str


def _alloc_value(current: str | None) -> str:
    if not current:
        return "expandable_segments:True"
    kept = [p for p in current.split(",") if p and not p.strip().startswith("expandable_segments")]
    return ",".join([*kept, "expandable_segments:True"])


RULES = (
    Rule("TASK_QUEUE_ENABLE", "2", lambda v: v != "2",
         "level 2 of the task queue: operators are dispatched by a second thread and part of their launch "
         "work leaves the Python thread, so the host keeps ahead of the device",
         "may raise peak device memory; torch_npu forces it to 0 in interactive sessions (python -i, Jupyter)"),
    Rule("CPU_AFFINITY_CONF", "1", lambda v: (v or "0").split(",")[0] not in ("1", "2"),
         "binds each rank's main, dispatch and data threads to the cores of its NPU's NUMA node: fewer "
         "cross-NUMA copies and steadier host time per step",
         "with several jobs on one node, give each its cores (2 = finer binding of the task queue's threads); "
         "`npu-migrate launch` sets it per rank on the NPU family (--cpu-binding)"),
    Rule("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True",
         lambda v: "expandable_segments:true" not in (v or "").replace(" ", "").lower(),
         "the caching allocator grows segments in place instead of keeping many fixed blocks: less "
         "fragmentation, fewer out-of-memory errors at the same batch size",
         "none known for training; some older CANN versions do not support virtual memory and ignore it"),
    Rule("ASCEND_LAUNCH_BLOCKING", "0", lambda v: v not in (None, "", "0"),
         "1 makes every operator launch synchronous (a debugging aid): the host waits for each kernel and "
         "the task queue is off",
         "set it to 1 again only to find which operator fails"),
    Rule("ASCEND_GLOBAL_LOG_LEVEL", "3", lambda v: v in ("0", "1"),
         "0 (debug) and 1 (info) write CANN logs for every operator: the host spends its time logging",
         "3 (error) keeps the errors; raise the level back only while debugging"),
)


def check(env: Mapping[str, str]) -> tuple[list[dict], list[str]]:
    """``(changes, good)``: one dict per variable to change (name, value, current, why, trade_off),
    one line per variable already right."""
    changes, good = [], []
    for rule in RULES:
        current = env.get(rule.name)
        if rule.needs_change(current):
            value = _alloc_value(current) if rule.name == "PYTORCH_NPU_ALLOC_CONF" else rule.value
            changes.append({"name": rule.name, "value": value, "current": current, "why": rule.why,
                            "trade_off": rule.trade_off})
        else:
            good.append(f"{rule.name} unset" if current is None else f"{rule.name}={current}")
    return changes, good
