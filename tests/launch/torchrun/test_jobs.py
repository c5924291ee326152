"""torchrun's flags in real jobs (CPU, gloo on loopback): what a user sees on the console, in files, in the ranks.

Parse-level checks of the same flags are in test_launch_torchrun_flags.py (the fast loop).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, LAUNCH_SCRIPTS, ROOT, child_env
from support import Launch, wait_for_files

SCRIPT = LAUNCH_SCRIPTS / "torchrun_job.py"
HOST = socket.gethostname()
pytestmark = pytest.mark.slow


def torch_at_least(major: int, minor: int) -> bool:
    return tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (major, minor)


def _report(out: Path, rank: int, attempt: int = 0) -> dict:
    return json.loads((out / f"torchrun-rank{rank}-attempt{attempt}.json").read_text())


def test_standalone_with_role_prefix_events_and_torchruns_variables(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--standalone", "--nnodes=1", "--nproc_per_node=2", "--role", "trainer",
                 "--log-line-prefix-template", "${role_name}${local_rank}@${hostname}: ", "--virtual-local-rank",
                 "--event-log-handler=console", "--monitor-interval", "0.2", "--start-method", "spawn",
                 "--numa-binding=node", "--enable_tiered_parallel_tcpstore=true", "--local-addr", "127.0.0.1",
                 "--run-path", "--no-python", str(SCRIPT), "--say", "hi")
    assert job.wait() == 0, job.err
    reports = [_report(tmp_path, rank) for rank in (0, 1)]
    for rank, r in enumerate(reports):
        env = r["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == (str(rank), "0", str(rank))
        assert (env["ROLE_NAME"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == ("trainer", str(rank), "2")
        async_name = "TORCH_NCCL_ASYNC_ERROR_HANDLING" if torch_at_least(2, 2) else "NCCL_ASYNC_ERROR_HANDLING"
        assert (env["MASTER_ADDR"], env[async_name], env["TORCHELASTIC_USE_AGENT_STORE"]) == ("127.0.0.1", "1", "True")
        assert re.fullmatch(r"[0-9a-f-]{36}", env["TORCHELASTIC_RUN_ID"])  # --standalone: a new id, as torchrun
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"torchelastic-error-rank{rank}.json")
        assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's agent's default
        assert r["sum"] == 3.0 and r["argv"] == [str(SCRIPT), "--say", "hi"]  # --run-path wins over --no-python
    assert f"trainer0@{HOST}: hi from rank 0" in job.outtext and f"trainer1@{HOST}: hi from rank 1" in job.outtext
    assert "settings from flags" in job.err and "CPU binding node (disjoint shares" in job.err
    events = [json.loads(line) for line in job.err.splitlines() if line.startswith('{"name": "torchelastic')]
    assert [(e["name"].rsplit(".", 1)[1], e["source"], e["metadata"]["global_rank"], e["metadata"]["role"])
            for e in events] == [("START", "WORKER", 0, "trainer"), ("START", "WORKER", 1, "trainer"),
                                 ("SUCCEEDED", "WORKER", 0, "trainer"), ("SUCCEEDED", "WORKER", 1, "trainer"),
                                 ("SUCCEEDED", "AGENT", None, "trainer")]


def test_redirects_tee_and_filters_write_torchruns_layout_across_a_restart(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    job = Launch(tmp_path, "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs), "--tee", "0:3",
                 "-r", "1:2", "--duplicate-stdout-filters", "hi from", "--log-line-prefix-template", "[${rank}] ",
                 str(SCRIPT), "--say", "hi", "--fail-first")
    assert job.wait() == 0, job.err
    (run,) = logs.glob("npu_migrate-*_*")  # <job id>_<random>, as torchrun's <rdzv id>_<random>
    assert f"ranks' logs in {run} (torchrun's layout" in job.err
    for attempt in (0, 1):
        base = run / f"attempt_{attempt}"
        files = sorted(str(p.relative_to(base)) for p in base.rglob("*.log"))
        # local rank 0: both streams tee'd (file and console); local rank 1: stderr redirected (file only)
        assert files == ["0/stderr.log", "0/stdout.log", "1/stderr.log", "filtered_stdout.log"]
        assert (base / "0" / "stdout.log").read_text() == "hi from rank 0\n"
        assert "hi err from rank 0" in (base / "0" / "stderr.log").read_text()
        assert (base / "1" / "stderr.log").read_text() == "hi err from rank 1\n"
        # console lines of stdout with "hi from", as shown (prefixed)
        assert sorted((base / "filtered_stdout.log").read_text().splitlines()) == [
            "[0] hi from rank 0", "[1] hi from rank 1"]
        for rank in (0, 1):
            assert _report(tmp_path, rank, attempt)["env"]["TORCHELASTIC_ERROR_FILE"] == str(base / str(rank) / "error.json")
    assert "ValueError: first attempt fails on rank 0" in (run / "attempt_0" / "0" / "stderr.log").read_text()
    assert f"full output: {run / 'attempt_0' / '0' / 'stderr.log'}" in job.err
    assert job.outtext.count("[0] hi from rank 0") == 2 and job.outtext.count("[1] hi from rank 1") == 2
    assert job.err.count("[0] hi err from rank 0") == 2 and "hi err from rank 1" not in job.err
    assert (logs / "launcher-node0.log").exists() and not list(logs.glob("rank*.log"))


def test_tee_without_log_dir_writes_under_a_new_temporary_directory(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--nproc-per-node", "1", "--tee", "3", str(SCRIPT), "--say", "hi", TMPDIR=str(tmp_path))
    assert job.wait() == 0, job.err
    (stdout,) = tmp_path.glob("torchelastic_*/npu_migrate-*_*/attempt_0/0/stdout.log")
    assert stdout.read_text() == "hi from rank 0\n" and "hi from rank 0" in job.outtext
    assert f"ranks' logs in {stdout.parents[2]}" in job.err


def test_no_python_runs_an_executable_as_each_rank(tmp_path: Path) -> None:
    tool = tmp_path / "tool.sh"
    # Rank 1 fails once rank 0 is done (the launcher then stops whatever still runs).
    tool.write_text('#!/bin/sh\necho "tool rank $RANK of $WORLD_SIZE local $LOCAL_RANK: $*"\n'
                    'echo "$RANK $MASTER_PORT" > "$OUT_DIR/tool$RANK"\n'
                    '[ "$RANK" = 1 ] || exit 0\nwhile [ ! -e "$OUT_DIR/tool0" ]; do sleep 0.1; done\nexit 3\n')
    tool.chmod(0o755)
    job = Launch(tmp_path, "--nproc-per-node=2", "--no-python", str(tool), "--epochs", "3")
    assert job.wait() == 1
    assert "tool rank 0 of 2 local 0: --epochs 3" in job.outtext
    assert "rank 1 (local rank 1 on node 0" in job.err and "exited with code 3" in job.err
    ports = {(tmp_path / f"tool{r}").read_text().split()[1] for r in (0, 1)}
    assert len(ports) == 1  # one job: both ranks got torchrun's variables for it
    ok = Launch(tmp_path, "--nproc_per_node", "1", "--no_python", "true", name="true")
    assert ok.wait() == 0, ok.err  # a command on PATH


def test_signals_to_handle_forwards_the_named_signal_and_exits_128_plus_it(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--nproc-per-node", "2", "--signals-to-handle", "SIGTERM,SIGUSR2", "--shutdown-timeout",
                 "60", str(SCRIPT), "--wait-signal")
    wait_for_files(tmp_path, ["ready0", "ready1"])
    job.proc.send_signal(signal.SIGUSR2)
    assert job.wait() == 128 + signal.SIGUSR2
    assert [(tmp_path / f"got{r}").read_text() for r in (0, 1)] == ["SIGUSR2", "SIGUSR2"]  # each rank's own handler
    assert {_report(tmp_path, r)["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"] for r in (0, 1)} == {"SIGTERM,SIGUSR2"}
    assert "received SIGUSR2: stopping 2 running rank(s) on node 0." in job.err


@pytest.mark.fake_npu
def test_nproc_words_and_the_tee_switch_on_the_subcommand_with_the_stand_in_npu(tmp_path: Path) -> None:
    env = child_env(FAKE_NPU, FAKE_NPU_DEVICE_COUNT="3", OUT_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "npu_migrate", "launch", "--dry-run", "--log-dir",
                             str(tmp_path / "logs"), "--tee", "--nproc-per-node", "npu", str(SCRIPT), "--tee", "x"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1 node(s) x 3 process(es) = 3 rank(s) on npu with hccl" in result.stdout
    assert f"target: {SCRIPT} --tee x" in result.stdout  # the script's own --tee is its own
    assert not os.path.exists(tmp_path / "logs")
    # --virtual-local-rank: each rank sees one device, its own, as device 0 (torchrun's meaning)
    virtual = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--nproc-per-node", "2",
                              "--virtual-local-rank", str(SCRIPT)],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert virtual.returncode == 0, virtual.stderr
    for rank in (0, 1):
        got = json.loads((tmp_path / f"torchrun-rank{rank}-attempt0.json").read_text())
        assert (got["env"]["LOCAL_RANK"], got["env"]["ASCEND_RT_VISIBLE_DEVICES"]) == ("0", str(rank))
        assert (got["device_count"], got["current_device"]) == (1, 0)
