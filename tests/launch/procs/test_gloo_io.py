"""gloo's transport thread on a rank bound to one CPU (:mod:`npu_migrate.launch.procs.gloo_io`): at nice 19.

What a user sees: on a rank whose binding is one CPU, each gloo group's transport loop (one per
group) runs at nice 19, and every other thread of the rank (its main thread, gloo's collective
threads, the script's own threads) keeps its priority; collectives give the same sums. Ranks with
more CPUs are left alone. torch from 2.8 or so names gloo's threads (``gloo_tcp_loop``,
``pt_gloo_runloop``); older releases leave them unnamed, and the transport loop is the thread that
waits in epoll: the torch 2.1 and 2.7 tiers run these tests on the unnamed side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS, ROOT, child_env

SCRIPT = LAUNCH_SCRIPTS / "gloo_threads_job.py"


def _launch(tmp_path: Path, cpus: set[int], *args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", *args, str(SCRIPT)],
                          env=child_env(OUT_DIR=str(tmp_path)), cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=lambda: os.sched_setaffinity(0, cpus))  # as `taskset -c` would
    assert proc.returncode == 0, proc.stderr
    reports = [json.loads((tmp_path / f"gloo-threads-rank{rank}.json").read_text()) for rank in range(2)]
    for r in reports:
        assert r["sums"] == [2.0, 4.0] and r["world"] == 2
    return reports


def _two_cpus() -> set[int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: one for each rank")
    return set(cpus[:2])


@pytest.mark.slow
def test_on_one_cpu_each_gloo_groups_transport_thread_gives_way(tmp_path: Path) -> None:
    cpus = _two_cpus()
    for rank, r in enumerate(_launch(tmp_path, cpus, "--cpu-binding")):
        assert r["cpus"] == [sorted(cpus)[rank]]
        lowered = [t for t in r["threads"] if t["nice"] == 19]
        kept = [t for t in r["threads"] if t["nice"] == 0]
        assert len(lowered) == 2 and len(kept) == len(r["threads"]) - 2  # one per group; nothing else moved
        for group in (0, 1):  # gloo starts a group's transport loop first, then its collective threads
            started = sorted((t for t in r["threads"] if t["group"] == group), key=lambda t: t["tid"])
            assert len(started) == 3 and [t["nice"] for t in started] == [19, 0, 0]
        if any(t["comm"] == "pt_gloo_runloop" for t in r["threads"]):  # newer torch names gloo's threads
            assert {t["comm"] for t in lowered} == {"gloo_tcp_loop"}
            assert all(t["comm"] != "gloo_tcp_loop" for t in kept)
        assert any(t["user"] for t in kept) and r["threads"][0] in kept  # the script's thread, the main thread


@pytest.mark.slow
def test_ranks_with_more_than_one_cpu_are_left_alone(tmp_path: Path) -> None:
    cpus = _two_cpus()
    for r in _launch(tmp_path, cpus):  # unbound: each rank may run on both CPUs
        assert r["cpus"] == sorted(cpus)
        assert {t["nice"] for t in r["threads"]} == {0}


def test_an_unnamed_thread_in_epoll_is_taken_for_gloos_only_in_a_group_of_gloo_alone() -> None:
    """Older torch leaves gloo's threads unnamed: the one waiting in epoll is the transport, but a
    group that also runs NCCL or HCCL may have threads of theirs waiting there, which keep their
    priority. Here an ordinary thread of this process waits in epoll."""
    import select
    import threading

    from npu_migrate.launch.procs import gloo_io

    poller = select.epoll()
    reader, writer = os.pipe()
    poller.register(reader, select.EPOLLIN)
    waiting = threading.Thread(target=poller.poll)
    waiting.start()
    tid = str(waiting.native_id)
    try:
        while "epoll" not in Path(f"/proc/self/task/{tid}/wchan").read_text():  # until it waits there
            pass
        assert gloo_io.transports({tid}, gloo_only=True) == [tid]
        assert gloo_io.transports({tid}, gloo_only=False) == []
    finally:
        os.write(writer, b"x")
        waiting.join()
        poller.close()
        os.close(reader)
        os.close(writer)
