"""What the launcher reads from the host and the cluster: host lists, addresses, interfaces, threads, families."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, ROOT, child_env
from support import JOB, Launch, reports

from npu_migrate.launch.setup import cluster
from npu_migrate.launch.setup.config import default_job_id, make_config


@pytest.mark.parametrize(("nodelist", "hosts"), [
    ("gpu07", ["gpu07"]),
    ("gpu[07-09,12],cpu1", ["gpu07", "gpu08", "gpu09", "gpu12", "cpu1"]),
    ("node[01-02]-ib", ["node01-ib", "node02-ib"]),
    ("rack[1-2]-n[003-004]", ["rack1-n003", "rack1-n004", "rack2-n003", "rack2-n004"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("a,b", ["a", "b"]),
])
def test_slurm_host_lists_expand(nodelist: str, hosts: list[str]) -> None:
    assert cluster.expand_hostlist(nodelist, use_scontrol=False) == hosts


@pytest.mark.parametrize("nodelist", ["n[1-", "n[3-1]", "n[]", "n]1["])
def test_unreadable_host_lists_are_refused(nodelist: str) -> None:
    with pytest.raises(ValueError):
        cluster.expand_hostlist(nodelist, use_scontrol=False)


def test_slurm_node_0_is_the_first_host_with_its_suffix(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "node[01-02]-ib"}
    result = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--dry-run", "--device-num", "1", str(JOB)],
                            env=child_env(**env), cwd=ROOT, capture_output=True, text=True, timeout=120)
    # node01-ib does not resolve here: the launcher names the expanded host, not a cut "node01".
    assert "--addr 'node01-ib' does not resolve" in result.stderr, result.stderr


def test_addresses_and_the_interface_that_reaches_them() -> None:
    assert cluster.is_local_address("127.0.0.1")
    assert not cluster.is_local_address("192.0.2.77")  # TEST-NET-1: never an address of this host
    assert cluster.interface_for("127.0.0.1") == ("lo", "127.0.0.1")
    env, note = cluster.network_env("127.0.0.1", "hccl", {})
    assert env == {"GLOO_SOCKET_IFNAME": "lo", "HCCL_SOCKET_IFNAME": "lo"} and note == "interface lo (127.0.0.1)"
    assert cluster.network_env("127.0.0.1", "hccl", {}, multi_node=False)[0] == {"GLOO_SOCKET_IFNAME": "lo"}
    env, note = cluster.network_env("127.0.0.1", "nccl", {"NCCL_SOCKET_IFNAME": "ib0"})
    assert env == {} and note == "interface from NCCL_SOCKET_IFNAME=ib0"


def test_job_id_from_the_scheduler_or_the_job_itself() -> None:
    assert default_job_id("10.0.0.1", 29500, "train.py", {"SLURM_JOB_ID": "77"}) == "slurm-77"
    assert default_job_id("10.0.0.1", 29500, "train.py", {"TORCHELASTIC_RUN_ID": "r1"}) == "r1"
    a = default_job_id("10.0.0.1", 29500, "train.py --lr 1", {})
    assert a == default_job_id("10.0.0.1", 29500, "train.py --lr 1", {})
    assert a != default_job_id("10.0.0.1", 29500, "train.py --lr 2", {})


def test_node_0_address_must_be_its_own(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate.launch", "--nnodes", "2", "--node-rank", "0", "--addr", "192.0.2.77",
         "--port", "29555", str(JOB)], env=child_env(OUT_DIR=str(tmp_path)), cwd=ROOT, capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "npu-migrate launch: error: --addr 192.0.2.77 is not an address of this host, but this is node 0, which "
        "serves the job there: run node rank 0 on the host that has 192.0.2.77, or pass one of this host's addresses."]


@pytest.mark.slow
def test_each_rank_gets_its_share_of_the_cores(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(JOB), "--sleep", "0", env_drop=("OMP_NUM_THREADS",))
    assert job.wait() == 0, job.err
    share = max(1, cluster.node_cores() // 2)
    assert [(r["threads"], r["extra_env"]["OMP_NUM_THREADS"]) for r in reports(tmp_path, 2)] == [(share, str(share))] * 2
    assert f"{share} thread(s) per rank" in job.err


@pytest.mark.slow
def test_the_users_omp_num_threads_wins(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(JOB), "--sleep", "0", OMP_NUM_THREADS="1")
    assert job.wait() == 0, job.err
    assert [(r["threads"], r["extra_env"]["OMP_NUM_THREADS"]) for r in reports(tmp_path, 2)] == [(1, "1")] * 2


@pytest.mark.slow
@pytest.mark.fake_npu
def test_device_cpu_on_an_accelerator_host_counts_cpu_ranks(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate.launch", "--dry-run", "--device", "cpu", str(JOB)],
        env=child_env(FAKE_NPU, ASCEND_RT_VISIBLE_DEVICES="0,1"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1 node(s) x 1 process(es) = 1 rank(s) on cpu with gloo" in result.stdout


def test_make_config_refuses_a_short_node_timeout() -> None:
    from npu_migrate.launch import LaunchUsageError

    with pytest.raises(LaunchUsageError, match=r"--node-timeout 1 is too short: expected 3 seconds or more"):
        make_config(1, node_timeout=1)
