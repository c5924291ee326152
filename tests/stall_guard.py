"""The suite's stall guard: a run whose xdist workers stop reporting ends, saying what was left.

The hang backstop (``conftest.HANG_BACKSTOP_S``) ends a test that hangs inside a worker. Nothing
ended a run that stalls outside any test: a worker stuck between tests, or xdist's controller
waiting for work it never hands out. Seen once on the fast loop: after the backstop ended a worker,
the controller and every worker (the new one too) sat idle for 19 minutes, none of them in a test,
until the run was killed by hand; in CI that is the job's own limit, an hour later, with nothing
said. Registered on the controller of an xdist run (``conftest.pytest_configure``), this plugin
follows the workers' reports (a test started, reported, finished; a worker down or collected):

- once every worker has collected the tests, while no test is in progress, :data:`IDLE_S` seconds
  without any of them end the run;
- while tests are in progress, or the workers still start, longer than any test may take before
  the backstop ends it does (the longest ``timeout`` mark, :data:`LONGEST_TEST_S`, plus the
  backstop and :data:`IDLE_S`), so a slow test never trips it.

Ending the run prints, on the controller's standard error, why, the tests in progress, the tests
xdist's scheduler holds as not completed, and every thread of the controller; then it ends the workers and
what they started, and exits with pytest's internal-error status (3).
``NPU_MIGRATE_TEST_STALL_S`` sets :data:`IDLE_S` (the test of the guard itself does).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

IDLE_S = float(os.environ.get("NPU_MIGRATE_TEST_STALL_S", "120"))
"""Seconds with no test in progress and no report from any worker before the run is ended."""
LONGEST_TEST_S = 900.0
"""The longest ``timeout`` mark in the suite (tests/compare/test_compare_runs.py's module)."""
EXIT_STALLED = 3  # pytest's ExitCode.INTERNAL_ERROR
SHOWN = 20  # tests named per list; the rest are counted


class StallGuard:
    """The plugin; :meth:`pytest_sessionstart` arms it only where xdist's controller runs."""

    def __init__(self, config: pytest.Config, backstop_s: float) -> None:
        self.config = config
        self.busy_s = LONGEST_TEST_S + backstop_s + IDLE_S
        self.running: dict[str, float] = {}
        self.last = time.monotonic()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    # -- what the workers report (these hooks run on the controller)

    def _seen(self) -> None:
        with self.lock:
            self.last = time.monotonic()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self.lock:
            self.running[nodeid] = self.last = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        with self.lock:
            self.running.pop(nodeid, None)
            self.last = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        with self.lock:
            if report.when not in ("setup", "call", "teardown"):  # a crashed worker's test ("???")
                self.running.pop(report.nodeid, None)
            self.last = time.monotonic()

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self._seen()

    def pytest_xdist_node_collection_finished(self, node: Any, ids: Any) -> None:
        self._seen()

    # -- the watch

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.config.pluginmanager.getplugin("dsession") is None:
            return  # no workers (-n 0): pytest-timeout and the backstop cover the one process
        self._seen()
        self.thread = threading.Thread(target=self._watch, name="npu_migrate-stall-guard", daemon=True)
        self.thread.start()

    def pytest_unconfigure(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        while not self.done.wait(min(10.0, IDLE_S / 2)):  # a watchdog's period, not a test's wait
            with self.lock:
                now = time.monotonic()
                quiet = now - self.last
                running = [f"{nodeid} ({now - started:.0f} s)" for nodeid, started in sorted(self.running.items())]
            limit = IDLE_S if self._scheduled() and not running else self.busy_s
            if quiet >= limit:
                self._end(quiet, running)

    def _end(self, quiet: float, running: list[str]) -> None:
        out = sys.__stderr__
        state = "tests in progress" if running else "no test in progress"
        lines = [f"npu_migrate test suite: stalled: no worker reported for {quiet:.0f} s with {state}; "
                 "ending the run (tests/stall_guard.py)",
                 _listed("in progress", running), _listed("not completed (xdist's scheduler)", self._not_completed()),
                 "the controller's threads:"]
        out.write("\n".join(lines) + "\n")
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
        out.flush()
        _kill_descendants()
        os._exit(EXIT_STALLED)

    def _scheduled(self) -> bool:
        """Whether every worker has collected, so xdist hands out tests (until then the workers start:
        imports and collection, which a loaded machine may stretch)."""
        sched = getattr(self.config.pluginmanager.getplugin("dsession"), "sched", None)
        return bool(getattr(sched, "collection_is_completed", False))

    def _not_completed(self) -> list[str]:
        """The tests xdist's scheduler still holds, queued or handed to a worker (loadscope's layout).

        A test counts as completed once its worker said so after the test's last hook, so the test
        a worker is stuck after is among them."""
        dsession = self.config.pluginmanager.getplugin("dsession")
        sched = getattr(dsession, "sched", None)
        try:
            units = list(getattr(sched, "workqueue", {}).values())
            units += [unit for work in list(getattr(sched, "assigned_work", {}).values()) for unit in work.values()]
            return sorted({nodeid for unit in units for nodeid, done in list(unit.items()) if not done})
        except (AttributeError, TypeError, RuntimeError):  # another scheduler's layout; or changed meanwhile
            return []


def _listed(what: str, nodeids: list[str]) -> str:
    more = f" ... and {len(nodeids) - SHOWN} more" if len(nodeids) > SHOWN else ""
    return f"{what} ({len(nodeids)}): {', '.join(nodeids[:SHOWN]) or '-'}{more}"


def _kill_descendants() -> None:
    """SIGKILL every process below this one (the workers, their launchers and ranks), deepest first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            ppid = int(text.rsplit(") ", 1)[1].split()[1])  # after the name, which may hold spaces
            children.setdefault(ppid, []).append(int(text.split(" (", 1)[0]))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    order: list[int] = []
    stack = [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            order.append(child)
            stack.append(child)
    for pid in reversed(order):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
