"""The launcher with real processes on gloo over loopback: worlds, faults, bad input."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, ROOT, TESTS, child_env, free_port
from support import JOB, Launch, alive, all_pids, assert_all_gone, reports, wait_for_files

HOST = socket.gethostname()


# --------------------------------------------------------------------------- worlds


def test_one_node_two_ranks_with_torchrun_environment(tmp_path: Path) -> None:
    args = ["--lr", "0.1", "--name", "a b", "-x", "--device-num", "5", "--", "tail"]
    job = Launch(tmp_path, "--device-num", "2", str(JOB), *args)
    assert job.wait() == 0, job.err
    got = reports(tmp_path, 2)
    port = got[0]["env"]["MASTER_PORT"]
    for rank, r in enumerate(got):
        assert r["name"] == "__main__"
        assert r["argv"] == [str(JOB), *args]  # untouched, launcher-looking flags included
        assert r["env"] == {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            "TORCHELASTIC_RESTART_COUNT": "0", "NPU_MIGRATE_DEVICE": "cpu",
        }
        assert (r["backend"], r["sum"]) == ("gloo", 3.0)
    assert "rank 0 says hello" in job.outtext and "rank 1 says hello" in job.outtext
    assert_all_gone(all_pids(tmp_path, 2))


@pytest.mark.slow
def test_two_nodes_two_ranks_each_are_node_major(tmp_path: Path) -> None:
    port = str(free_port())
    common = ["--nnodes", "2", "--device-num", "2", "--addr", "127.0.0.1", "--port", port, "--join-timeout", "60"]
    node1 = Launch(tmp_path, *common, "--node-rank", "1", str(JOB), "--sleep", "0", name="node1")
    node0 = Launch(tmp_path, *common, "--node-rank", "0", str(JOB), "--sleep", "0", name="node0")
    assert node0.wait() == 0, node0.err
    assert node1.wait() == 0, node1.err
    got = reports(tmp_path, 4)
    assert [(r["env"]["NODE_RANK"], r["env"]["LOCAL_RANK"], r["env"]["RANK"]) for r in got] == [
        ("0", "0", "0"), ("0", "1", "1"), ("1", "0", "2"), ("1", "1", "3")]
    assert all(r["env"]["WORLD_SIZE"] == "4" and r["sum"] == 10.0 for r in got)


@pytest.mark.slow
def test_module_target_and_subcommand(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "launch", "--device-num", "2", "-m", "launch.scripts.launch_job", "--k", "v"],
        env=child_env(OUT_DIR=str(tmp_path)), cwd=TESTS, capture_output=True, text=True, timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert [r["argv"][1:] for r in reports(tmp_path, 2)] == [["--k", "v"]] * 2


@pytest.mark.slow
def test_function_target_like_seed_003(tmp_path: Path) -> None:
    from npu_migrate.launch import JobFailed, spawn
    from npu_migrate.launch import cpplog
    from launch.scripts.spawn_target import train

    before = (os.environ.get(cpplog.ENV), cpplog.level())
    spawn(train, args=(str(tmp_path),), nproc=2)
    got = reports(tmp_path, 2)
    assert [(r["local_rank_arg"], r["rank"], r["env_rank"], r["sum"]) for r in got] == [(0, 0, "0", 3.0), (1, 1, "1", 3.0)]
    with pytest.raises(JobFailed, match="exit code 1") as info:
        spawn(train, args=(str(tmp_path), 1), nproc=2)
    assert info.value.exit_code == 1
    # The caller's process goes on: torch's C++ log setting is what it was (its later children inherit it).
    assert (os.environ.get(cpplog.ENV), cpplog.level()) == before


@pytest.mark.slow
def test_log_dir_has_one_file_per_rank(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    job = Launch(tmp_path, "--device-num", "2", "--log-dir", str(logs), str(JOB), "--fail", "--on-rank", "1")
    assert job.wait() == 1
    assert "rank 0 says hello" in (logs / "rank0.log").read_text()
    assert "ValueError: boom on rank 1" in (logs / "rank1.log").read_text()
    assert f"full output: {logs / 'rank1.log'}" in job.err


@pytest.mark.slow
def test_restart_after_a_failure(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--device-num", "2", "--max-restarts", "1", str(JOB), "--fail-first", "--on-rank", "0")
    assert job.wait() == 0, job.err
    assert "restarting the job (restart 1 of 1)" in job.err
    assert all(r["env"]["TORCHELASTIC_RESTART_COUNT"] == "1" for r in reports(tmp_path, 2))


@pytest.mark.slow
def test_dry_run_prints_the_world_and_starts_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate.launch", "--dry-run", "--nnodes", "2", "--node-rank", "1",
         "--device-num", "2", "--port", "29555", str(JOB), "--epochs", "3"],
        env=child_env(OUT_DIR=str(tmp_path)), cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2 node(s) x 2 process(es) = 4 rank(s) on cpu with gloo; master 127.0.0.1:29555; settings from flags" in out
    assert "   1           0     2  cpu       gloo" in out and "   1           1     3  cpu       gloo" in out
    assert "rank 3: RANK=3 LOCAL_RANK=1 WORLD_SIZE=4" in out
    assert f"target: {JOB} --epochs 3" in out
    assert not list(tmp_path.glob("rank*.json"))


@pytest.mark.slow
def test_slurm_environment_fills_in_the_nodes(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "localhost,node[2-3]"}
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate.launch", "--dry-run", "--device-num", "2", str(JOB)],
        env=child_env(**env), cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "master localhost:29500; settings from Slurm (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST): nnodes, node_rank, addr" in result.stdout
    assert "rank 2: RANK=2 LOCAL_RANK=0" in result.stdout


@pytest.mark.parametrize(("nodelist", "first"), [
    ("gpu07", "gpu07"), ("gpu[07-09,12],cpu1", "gpu07"), ("a,b", "a"), ("n[1,3]", "n1"), ("rack1-n[003-004]", "rack1-n003"),
])
def test_first_host_of_a_slurm_node_list(nodelist: str, first: str) -> None:
    from npu_migrate.launch.setup.config import _slurm_first_host

    assert _slurm_first_host(nodelist) == first


@pytest.mark.slow
@pytest.mark.fake_npu
def test_simulated_npu_job_binds_one_device_per_rank(tmp_path: Path) -> None:
    job = Launch(tmp_path, str(JOB), paths=(FAKE_NPU,), ASCEND_RT_VISIBLE_DEVICES="0,1")
    assert job.wait() == 0, job.err  # default --device-num: the 2 visible devices
    assert "2 process(es) on npu with hccl" in job.err
    for rank, r in enumerate(reports(tmp_path, 2)):
        assert (r["backend"], r["device"], r["current_device_index"]) == ("hccl", f"npu:{rank}", rank)
        assert r["env"]["NPU_MIGRATE_DEVICE"] == "npu"


# --------------------------------------------------------------------------- faults


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_job_and_is_named(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(JOB), "--fail", "--on-rank", "1")
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    assert job.wait() == 1
    err = job.err
    assert f"rank 1 (local rank 1 on node 0, host {HOST}) failed: ValueError: boom on rank 1" in err
    assert 'raise ValueError(f"boom on rank {info.rank}")' in err  # the traceback's tail
    assert "job failed: stopped 1 other rank(s) on node 0; exit code 1." in err
    assert "Traceback" in err and "npu_migrate/launch.py" not in err
    assert_all_gone(all_pids(tmp_path, 2))


@pytest.mark.parametrize(("args", "message"), [
    (["--signal", "SIGKILL"], "was killed by SIGKILL (often the kernel's out-of-memory killer"),
    (["--signal", "SIGSEGV"], "was killed by SIGSEGV (a crash in native code"),
    (["--exit", "7"], "exited with code 7 without a Python traceback"),
])
@pytest.mark.slow
def test_a_rank_that_dies_without_python_ends_the_job(tmp_path: Path, args: list[str], message: str) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(JOB), *args, "--on-rank", "0")
    assert job.wait(60) == 1
    assert f"rank 0 (local rank 0 on node 0, host {HOST}) {message}" in job.err
    assert_all_gone(all_pids(tmp_path, 2))


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_the_launcher_ends_every_rank(tmp_path: Path, sig: int, code: int) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(JOB), "--hang")
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    pids = all_pids(tmp_path, 2)
    job.proc.send_signal(sig)
    assert job.wait(15) == code
    assert f"received {signal.Signals(sig).name}: stopping 2 running rank(s) on node 0." in job.err
    assert_all_gone(pids, timeout=2)


@pytest.mark.slow
def test_sigkill_to_the_launcher_leaves_no_orphans(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(JOB), "--hang")
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    pids = all_pids(tmp_path, 2)  # workers and the `sleep` each one started
    assert len(pids) == 4 and all(alive(p) for p in pids)
    job.proc.kill()
    job.proc.wait()
    assert_all_gone(pids, timeout=10)


@pytest.mark.slow
def test_failure_on_one_node_ends_the_other_node_quickly(tmp_path: Path) -> None:
    port = str(free_port())
    common = ["--nnodes", "2", "--device-num", "2", "--addr", "127.0.0.1", "--port", port, "--join-timeout", "60"]
    # Node 0's ranks sleep outside any collective: only the launchers can end them.
    node0 = Launch(tmp_path, *common, "--node-rank", "0", str(JOB), "--fail", "--on-rank", "3", name="node0")
    node1 = Launch(tmp_path, *common, "--node-rank", "1", str(JOB), "--fail", "--on-rank", "3", name="node1")
    wait_for_files(tmp_path, [f"rank{r}.json" for r in range(4)])
    assert node1.wait(30) == 1
    assert node0.wait(30) == 1
    assert "rank 3 (local rank 1 on node 1" in node1.err
    assert "rank 3 (local rank 1 on node 1" in node0.err and "failed: ValueError: boom on rank 3 on node 1" in node0.err
    assert_all_gone(all_pids(tmp_path, 4))


# --------------------------------------------------------------------------- bad input


def refuse(tmp_path: Path, *args: str, paths: tuple = (), code: int = 2, **env: str) -> str:
    """The one line a refused launch prints; ``code``: 2 for a usage error, 1 for a family that cannot be used."""
    result = subprocess.run([sys.executable, "-m", "npu_migrate.launch", *args],
                            env=child_env(*paths, OUT_DIR=str(tmp_path), **env), cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert (result.returncode, len(lines)) == (code, 1) and "Traceback" not in result.stderr, result.stderr
    assert not list(tmp_path.glob("rank*.json"))  # nothing started
    return lines[0]


@pytest.mark.parametrize(("args", "message"), [
    (["--device-num", "0", str(JOB)], "--device-num 0 is not positive"),
    (["--nnodes", "2", "--node-rank", "2", str(JOB)], "--node-rank 2 is outside [0, 2) for --nnodes 2"),
    (["--node-rank", "-1", str(JOB)], "--node-rank -1 is outside [0, 1)"),
    (["missing_script.py"], "script 'missing_script.py' not found"),
    (["-m", "no_such_module_xyz"], "module 'no_such_module_xyz' not found"),
    (["--device", "gpu", str(JOB)], "argument --device: invalid choice: 'gpu'"),
    (["--port", "0", str(JOB)], "--port 0 is outside 1-65535"),
    (["--port", "70000", str(JOB)], "--port 70000 is outside 1-65535"),
    (["--device", "npu", str(JOB)], "npu needs torch_npu, which is not installed"),
    (["--addr", "no-such-host.invalid", str(JOB)], "--addr 'no-such-host.invalid' does not resolve"),
    (["--device-num", "two", str(JOB)], "argument --device-num/--device_num/--nproc-per-node/--nproc_per_node: 'two' is not a process count: "
                                       "expected a number or one of auto, cpu, gpu, npu, xpu"),
    ([], "the following arguments are required: SCRIPT"),
])
@pytest.mark.slow
def test_bad_input_is_refused_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    # docs/cli.md: 2 for a usage error; 1 where the device family cannot be used.
    assert message in refuse(tmp_path, *args, code=1 if "torch_npu" in message else 2)


@pytest.mark.slow
@pytest.mark.fake_npu
def test_more_processes_than_devices_is_refused(tmp_path: Path) -> None:
    line = refuse(tmp_path, "--device-num", "4", str(JOB), paths=(FAKE_NPU,), ASCEND_RT_VISIBLE_DEVICES="0,1")
    assert "--device-num 4 is more than the 2 npu device(s) visible here (ASCEND_RT_VISIBLE_DEVICES='0,1'). Use --device-num 2 or fewer." in line


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = refuse(tmp_path, "--port", str(port), str(JOB), code=1)  # a well-formed value the host cannot serve now
    assert f"port {port} is in use on this host: pick another --port or leave it out to get a free one." in line


def test_a_refused_configuration_leaves_no_migrate_report_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    line = refuse(tmp_path, "--migrate", "--migrate-report", str(tmp_path / "report.md"), "--port", "0", str(JOB),
                  TMPDIR=str(tmp))
    assert "--port 0 is outside 1-65535" in line
    assert not list(tmp.glob("npu_migrate_report_*"))
    assert not (tmp_path / "report.md").exists()
