"""Hangs, stacks and failure reports with real launchers and ranks (gloo on loopback).

Each launched job checks several things at once (the suite's time budget): the hang report
names the rank that is behind and shows every rank's stack; ``--hang-action report`` keeps the
job running while ``npu-migrate stacks PID`` and ``kill -USR1`` print stacks; ``--error-file``
records crashes, SIGKILL and hangs; and the same across two launchers as two nodes.
Tests wait on files and output, never on time: pytest-timeout guards against a real hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS, ROOT, child_env, free_port
from npu_migrate.launch.nodes.records import order
from npu_migrate.launch.procs.failure import Failure
from support import Launch, rank_block, wait_all, wait_for_text, wait_until

HANG_JOB = LAUNCH_SCRIPTS / "hang_job.py"


def stacks_cli(pid: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npu_migrate", "stacks", str(pid)], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- one node


@pytest.mark.slow
def test_a_rank_that_skips_an_all_reduce_and_spins_is_named_with_every_stack(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    job = Launch(tmp_path, "--device-num", "3", "--hang-timeout", "10", "--error-file", str(error_file),
                 str(HANG_JOB), "--skip", "1", "--busy")
    assert job.wait() == 1, job.err
    err = job.err
    # Who is behind, where the others wait, and every rank's stack (all threads).
    assert "hang: no rank made progress for 1" in err and "(--hang-timeout 10)" in err
    assert "hang: rank 1 is not in a collective (last: all_reduce #3 ended " in err
    assert "; ranks 0, 2 are in all_reduce #4 since " in err
    for rank in (0, 2):
        block = rank_block(err, rank)
        assert block.startswith(f"--- rank {rank}: in all_reduce #4 since"), block
        assert "hang_job.py\", line" in block and "in all_reduce" in block
    block = rank_block(err, 1)
    assert block.startswith("--- rank 1: not in a collective (last: all_reduce #3"), block
    assert "in busy_wait" in block
    assert "npu_migrate/launch/procs/worker.py" not in err and "runpy" not in err  # the launcher's frames are left out
    assert "job failed: stopped 3 rank(s) on node 0; exit code 1." in err

    report = json.loads(error_file.read_text())
    assert (report["outcome"], report["exit_code"], report["first_failure"]["kind"]) == ("hang", 1, "hang")
    assert report["hang"]["behind"] == [1]
    assert "in busy_wait" in report["hang"]["stacks"]["1"]
    assert report["hang"]["states"]["0"]["op"] == "all_reduce" and report["hang"]["states"]["0"]["seq"] == 4
    assert [(r["rank"], r["signal"], r["stopped_by_launcher"]) for r in report["ranks"]] == [
        (0, "SIGTERM", True), (1, "SIGTERM", True), (2, "SIGTERM", True)]


@pytest.mark.slow
def test_a_rank_that_never_reaches_ddps_backward_is_named(tmp_path: Path) -> None:
    """DDP's gradient all-reduce runs from C++ inside backward(): recorded as ddp_backward."""
    job = Launch(tmp_path, "--device-num", "2", "--hang-timeout", "5", str(LAUNCH_SCRIPTS / "ddp_hang_job.py"))
    assert job.wait() == 1, job.err
    err = job.err
    # DDP's construction is verify_params #1 and broadcast_coalesced #2; the evaluation forward
    # under no_grad records nothing: steps 0 and 1 are #3 and #4.
    assert "hang: rank 1 is not in a collective (last: ddp_backward #4 ended " in err, err
    assert "; rank 0 is in ddp_backward #5 since " in err, err
    assert rank_block(err, 0).startswith("--- rank 0: in ddp_backward #5 since")
    assert "ddp_hang_job.py\", line" in rank_block(err, 1)


@pytest.mark.slow
def test_report_only_keeps_the_job_running_and_stacks_come_on_demand(tmp_path: Path) -> None:
    release, error_file = tmp_path / "release", tmp_path / "error.json"
    job = Launch(tmp_path, "--device-num", "2", "--hang-timeout", "3", "--hang-action", "report",
                 "--error-file", str(error_file), str(HANG_JOB), "--skip", "1", "--release", str(release))
    try:
        wait_for_text(job.stderr, "the job keeps running")
        assert "hang: rank 1 is not in a collective (last: all_reduce #3" in job.err

        # From another shell: the launcher's pid prints every rank's stack; the job goes on.
        asked = stacks_cli(job.proc.pid)
        assert asked.returncode == 0, asked.stderr
        assert "--- rank 0: in all_reduce #4 since" in asked.stdout
        assert "--- rank 1: not in a collective" in asked.stdout and "in sleep_wait" in asked.stdout
        # kill -USR1 <launcher pid> prints them on the launcher's console.
        job.proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: job.err.count("on request (SIGUSR1)") >= 2, "a second dump on the console")
        assert job.proc.poll() is None
        assert job.err.count("hang: no rank made progress") == 1  # the same stall is reported once

        # A pid that is not a launcher is refused in one line, and not signalled.
        other = stacks_cli(os.getpid())
        assert other.returncode == 1 and other.stderr.count("\n") == 1, other.stderr
        assert f"pid {os.getpid()} is not an npu-migrate launcher" in other.stderr
    finally:
        release.touch()  # rank 1 makes up its all-reduce: progress resumes and the job ends
    assert job.wait() == 0, job.err
    report = json.loads(error_file.read_text())
    assert report["outcome"] == "ok" and report["hang"]["behind"] == [1]
    assert [(r["rank"], r["exit_code"]) for r in report["ranks"]] == [(0, 0), (1, 0)]


@pytest.mark.parametrize(("args", "first"), [
    (["--crash", "1"], {"rank": 1, "exc_type": "RuntimeError", "signal": None}),
    (["--kill", "0"], {"rank": 0, "exc_type": None, "signal": "SIGKILL"}),
], ids=["crash", "sigkill"])
@pytest.mark.slow
def test_the_error_file_records_every_rank(tmp_path: Path, args: list[str], first: dict) -> None:
    error_file, logs = tmp_path / "error.json", tmp_path / "logs"
    # --preflight passes here: the script still runs (and fails as it should).
    job = Launch(tmp_path, "--device-num", "2", "--error-file", str(error_file), "--log-dir", str(logs),
                 "--preflight", str(HANG_JOB), *args)
    assert job.wait() == 1, job.err
    report = json.loads(error_file.read_text())
    assert report == json.loads((logs / "report-node0.json").read_text())
    assert report["outcome"] == "failed" and report["hang"] is None
    ranks = {r["rank"]: r for r in report["ranks"]}
    failed, other = ranks[first["rank"]], ranks[1 - first["rank"]]
    assert failed["first_failure"] and not other["first_failure"]
    assert (failed["exc_type"], failed["signal"], failed["stopped_by_launcher"]) == (
        first["exc_type"], first["signal"], False)
    assert other["stopped_by_launcher"]
    if first["exc_type"]:
        assert failed["exit_code"] == 1 and "crash on rank 1" in failed["traceback"]
        assert "raise RuntimeError" in job.err
    else:
        assert failed["exit_code"] == -9 and "out-of-memory killer, or an external kill" in failed["hint"]
        assert "was killed by SIGKILL (often the kernel's out-of-memory killer, or an external kill" in job.err
    assert report["first_failure"]["rank"] == first["rank"]


@pytest.mark.parametrize("text", [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40213",
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [192.0.2.2]:55509: Connection reset by peer",
    "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5",
])
def test_a_peers_error_about_a_death_comes_after_the_death_whatever_the_clocks(text: str) -> None:
    killed = Failure(1, 1, 0, "gpu7", exit_code=-9, signal_name="SIGKILL", time=20.0)
    broken = Failure(0, 0, 0, "gpu7", exit_code=1, exc_type="DistBackendError", message=text, time=19.9)
    plain = Failure(2, 0, 1, "gpu8", exit_code=1, exc_type="ValueError", message="boom", time=20.5)
    assert min([broken, killed], key=order).rank == 1  # the death was seen after the error it caused
    assert min([broken, plain, killed], key=order).rank == 1  # then causes by time
    assert min([broken], key=order).rank == 0  # a consequence alone still ends the job as the first failure


@pytest.mark.slow
def test_a_rank_killed_during_a_collective_is_named_first_not_the_peer_it_broke(tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed while rank 0 is in (or entering) an all-reduce with it: gloo ends rank 0
    with "Connection closed by peer", maybe before the launcher has seen rank 1's death. The
    report names the cause, rank 1, whatever the order in which the launcher saw the two."""
    error_file = tmp_path / "error.json"
    job = Launch(tmp_path, "--device-num", "2", "--error-file", str(error_file), str(HANG_JOB),
                 "--kill", "1", "--in-collective")
    assert job.wait() == 1, job.err
    report = json.loads(error_file.read_text())
    first = report["first_failure"]
    assert (first["rank"], first["signal_name"]) == (1, "SIGKILL"), first
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[1]["first_failure"] and not ranks[0]["first_failure"], report["ranks"]
    failed = [line for line in job.err.splitlines() if line.startswith("npu-migrate launch: ") and " rank " in line
              and ("failed" in line or "killed" in line)]
    assert failed and "rank 1 (local rank 1 on node 0" in failed[0] and "was killed by SIGKILL" in failed[0], job.err


# --------------------------------------------------------------------------- two nodes


def two_nodes(tmp: Path, *extra: str, job: tuple[str, ...]) -> list[Launch]:
    port = free_port()
    return [Launch(tmp, "--nnodes", "2", "--node-rank", str(n), "--device-num", "1", "--addr", "127.0.0.1",
                   "--port", str(port), "--node-timeout", "5", "--error-file", str(tmp / f"error{n}.json"),
                   *extra, str(HANG_JOB), *job, name=f"node{n}") for n in (0, 1)]


@pytest.mark.long
def test_two_nodes_each_show_their_stacks_and_node_0_says_who_is_behind(tmp_path: Path) -> None:
    nodes = two_nodes(tmp_path, "--hang-timeout", "5", job=("--skip", "1"))
    assert wait_all(nodes) == [1, 1], nodes[0].err + nodes[1].err
    err0, err1 = nodes[0].err, nodes[1].err
    summary = "rank 1 is not in a collective (last: all_reduce #3 ended "
    assert f"hang: {summary}" in err0 and "; rank 0 is in all_reduce #4 since" in err0
    assert rank_block(err0, 0).startswith("--- rank 0 on node 0: in all_reduce #4 since")
    assert "--- rank 1" not in err0  # each launcher shows its own ranks
    assert f"node 0 reports a hang: {summary}" in err1
    block = rank_block(err1, 1)
    assert block.startswith("--- rank 1 on node 1: not in a collective") and "in sleep_wait" in block
    reports = [json.loads((tmp_path / f"error{n}.json").read_text()) for n in (0, 1)]
    assert [r["outcome"] for r in reports] == ["hang", "hang"]
    assert [list(r["hang"]["stacks"]) for r in reports] == [["0"], ["1"]]
    assert all(r["first_failure"]["behind"] == [1] for r in reports)


@pytest.mark.long
def test_two_nodes_agree_on_the_first_failure(tmp_path: Path) -> None:
    nodes = two_nodes(tmp_path, job=("--crash", "1"))
    assert wait_all(nodes) == [1, 1], nodes[0].err + nodes[1].err
    for n in nodes:
        assert "rank 1 (local rank 0 on node 1" in n.err and "failed: RuntimeError: crash on rank 1" in n.err
    reports = [json.loads((tmp_path / f"error{n}.json").read_text()) for n in (0, 1)]
    assert all(r["first_failure"]["rank"] == 1 and r["outcome"] == "failed" for r in reports)
    assert reports[1]["ranks"][0]["first_failure"] and not reports[0]["ranks"][0]["first_failure"]


@pytest.mark.slow
def test_preflight_names_the_rank_and_interface_that_cannot_work(tmp_path: Path) -> None:
    port = free_port()
    nodes = [Launch(tmp_path, "--nnodes", "2", "--node-rank", str(n), "--device-num", "1", "--addr", "127.0.0.1",
                    "--port", str(port), "--node-timeout", "5", "--preflight", str(HANG_JOB), name=f"node{n}",
                    GLOO_SOCKET_IFNAME="nosuch0" if n else "lo") for n in (0, 1)]
    assert wait_all(nodes) == [1, 1], nodes[0].err + nodes[1].err
    line = ("preflight: the gloo all-reduce failed on rank 1 (host {host}, interface nosuch0): RuntimeError: Unable "
            "to find address for: nosuch0; hint: gloo could not use the network interface: set GLOO_SOCKET_IFNAME")
    import socket

    assert nodes[1].err.strip().splitlines()[-1].startswith(f"npu-migrate launch: error: {line.format(host=socket.gethostname())}")
    assert f"error: node 1: {line.format(host=socket.gethostname())}" in nodes[0].err
    for n in nodes:
        assert "Traceback" not in n.err
    assert not list(tmp_path.glob("at-end*"))  # the script never started


# --------------------------------------------------------------------------- without processes


def test_the_flight_record_round_trips_and_covers_the_collectives(tmp_path: Path) -> None:
    from npu_migrate.launch.hangs import flight

    names = flight.collective_names()
    assert {"all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
            "all_to_all_single", "send", "recv", "all_gather_object", "monitored_barrier"} <= set(names)
    assert not {"get_rank", "get_world_size", "new_group", "destroy_process_group"} & set(names)
    record = flight.FlightRecord(str(tmp_path / "r.bin"), 3)
    assert flight.read(str(tmp_path / "r.bin")).describe() == "not in a collective (none entered yet)"
    record.enter(b"all_reduce", None)
    state = flight.read(str(tmp_path / "r.bin"))
    assert (state.rank, state.in_collective, state.seq, state.op, state.group) == (3, True, 1, "all_reduce", "world")
    assert not record.enter(b"broadcast", None)  # nested: not recorded
    record.leave(False)
    record.leave(True)
    state = flight.read(str(tmp_path / "r.bin"))
    assert state.describe().startswith("not in a collective (last: all_reduce #1 ended ")


def test_hints_come_from_tables() -> None:
    from npu_migrate.launch import hints

    assert "GLOO_SOCKET_IFNAME" in hints.error_hint("RuntimeError: [enforce fail] Unable to find address for: eth9")
    assert "HCCL_CONNECT_TIMEOUT" in hints.error_hint("EI0006: wait socket establish timeout, role[0] rank[0]")
    assert "NCCL_SOCKET_IFNAME" in hints.error_hint("NCCL WARN Net : No interface found in the same subnet")
    assert "peer" in hints.error_hint("Connection closed by peer [127.0.0.1]:1234")
    assert hints.error_hint("ValueError: bad learning rate") is None
    assert "dmesg" in hints.signal_hint("SIGKILL") and hints.signal_hint("SIGUSR2") is None


def test_stacks_help_does_not_import_torch() -> None:
    code = ("import sys\nfrom npu_migrate.cli import main\ntry:\n    main(['stacks', '--help'])\nexcept SystemExit:\n"
            "    pass\nassert 'torch' not in sys.modules, 'torch imported'\n")
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "npu-migrate stacks" in result.stdout
