"""The suite's own guards: a stuck test, or a worker stuck between tests, never stalls the suite.

A test stuck where pytest-timeout's signal handler cannot run is ended with every thread's stack
(tests/conftest.py, HANG_BACKSTOP_S), reported as a crashed worker, and the tests queued behind it
still run. A run whose workers stop reporting outside any test ends with what was left to run
(tests/stall_guard.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS, child_env

STUCK = '''
import signal, time
import pytest

@pytest.mark.timeout(1)
def test_stuck_where_no_handler_runs():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # pytest-timeout's alarm never arrives
    time.sleep(120)

def test_queued_behind_it():
    pass
'''

STALLED = '''
def test_first():
    pass

def test_second():
    pass
'''
STUCK_BETWEEN_TESTS = '''
import os
import re
import threading

import pytest


@pytest.hookimpl(trylast=True)  # after xdist has told the controller that the test finished
def pytest_runtest_logfinish(nodeid, location):
    if os.environ.get("PYTEST_XDIST_WORKER") and nodeid.endswith("test_first"):
        threading.Event().wait()  # the worker never asks for its next test
'''


@pytest.mark.slow
def test_a_test_stuck_past_its_timeout_is_named_with_its_stacks_and_the_suite_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    env = _own_suite_env(NPU_MIGRATE_TEST_HANG_BACKSTOP_S="2")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-n", "1", "--dist", "loadscope", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_stuck.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "crashed while running 'test_stuck.py::test_stuck_where_no_handler_runs'" in out, out
    assert "hung test: test_stuck.py::test_stuck_where_no_handler_runs did not end within 3 s" in out, out
    assert 'test_stuck.py", line 8 in test_stuck_where_no_handler_runs' in out, out  # the stuck line
    assert "1 failed, 1 passed" in out, out  # the test queued behind it ran on a new worker


def _own_suite_env(**extra: str) -> dict[str, str]:
    """A suite of its own: not one of this run's workers, and not in its times file."""
    env = child_env(PYTHONPATH=os.pathsep.join(str(p) for p in (TESTS, *extra.pop("paths", ()))), **extra)
    own = ("NPU_MIGRATE_TEST_HANG_DIR", "NPU_MIGRATE_TEST_TIMES")
    for name in [n for n in env if n.startswith("PYTEST_XDIST_") or n in own]:
        env.pop(name)
    return env


@pytest.mark.slow
def test_a_run_whose_worker_stops_between_tests_ends_naming_what_was_left(tmp_path: Path) -> None:
    (tmp_path / "test_stalled.py").write_text(STALLED)
    (tmp_path / "stuck_between_tests.py").write_text(STUCK_BETWEEN_TESTS)
    env = _own_suite_env(paths=(tmp_path,), NPU_MIGRATE_TEST_STALL_S="2")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "stuck_between_tests", "-n", "1", "--dist", "loadscope",
         "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path / "test_stalled.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
    )  # returns only once the stuck worker is gone too: it holds the pipes
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert "npu_migrate test suite: stalled: no worker reported for " in out, out
    assert "with no test in progress; ending the run" in out, out
    assert "in progress (0): -" in out, out
    assert result.stdout.rstrip().endswith("."), out  # test_first passed, and nothing ran after it
    # test_first too: its worker never told xdist that it was done with it
    assert "not completed (xdist's scheduler) (2): test_stalled.py::test_first, test_stalled.py::test_second" in out, out
    assert "the controller's threads:" in out and "_watch" in out, out  # the guard's own thread among them


def test_no_test_may_take_longer_than_the_stall_guard_allows() -> None:
    """The guard's limit with tests in progress covers the longest ``timeout`` mark and the ini's."""
    from stall_guard import LONGEST_TEST_S

    marks = [float(n) for path in TESTS.rglob("test_*.py")
             for n in re.findall(r"mark\.timeout\((\d+(?:\.\d+)?)\)", path.read_text())]
    ini = float(re.search(r"^timeout = (\d+)", (TESTS.parent / "pyproject.toml").read_text(), re.M).group(1))
    assert max([*marks, ini]) <= LONGEST_TEST_S, (marks, ini)
