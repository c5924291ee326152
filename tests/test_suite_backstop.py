"""The suite's own hang backstop (tests/conftest.py, HANG_BACKSTOP_S): a stuck test never stalls the suite.

A test stuck where pytest-timeout's signal handler cannot run is ended with every thread's stack,
reported as a crashed worker, and the tests queued behind it still run.
"""

from __future__ import annotations

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


@pytest.mark.slow
def test_a_test_stuck_past_its_timeout_is_named_with_its_stacks_and_the_suite_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    env = child_env(NPU_MIGRATE_TEST_HANG_BACKSTOP_S="2", PYTHONPATH=str(TESTS))
    # A suite of its own: not one of this run's workers, and not in its times file.
    own = ("NPU_MIGRATE_TEST_HANG_DIR", "NPU_MIGRATE_TEST_TIMES")
    for name in [n for n in env if n.startswith("PYTEST_XDIST_") or n in own]:
        env.pop(name)
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
