"""Schedulers the launcher recognises (AscendJob, Volcano, Kubeflow, Ray, Slurm, plain variables) and HCCL rank tables.

Environment and file fixtures for detection and parsing; real launchers on 127.0.0.1 for a 2-"pod"
AscendJob and a rank table completed while the launchers wait for it.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT, child_env, free_port
from support import HANG_GUARD_S, JOB, Launch, one_line_errors, reports, wait_for_text

from npu_migrate.launch.setup import ranktable, schedulers
from npu_migrate.launch.setup.schedulers import Scheduler

ASCEND_POD = {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "{0,1,2,3}", "LOCAL_WORLD_SIZE": "4",
              "MASTER_ADDR": "10.96.0.12", "MASTER_PORT": "2222", "MINDX_TASK_ID": "7f3c"}

# ----------------------------------------------------------------------------- detection from variables


def test_an_ascendjob_pod_rank_is_a_node_rank_and_its_npus_are_the_processes() -> None:
    found = schedulers.detect(ASCEND_POD)
    assert found.scheduler is Scheduler.ASCENDJOB
    assert found.values == {"nnodes": 2, "node_rank": 1, "nproc": 4, "addr": "10.96.0.12", "port": 2222}
    assert found.addr_is_service and found.device == "npu"
    assert found.source.startswith("MindCluster AscendJob (MINDX_TASK_ID, RANK, WORLD_SIZE, LOCAL_RANK")
    # The operator's own spelling (localRankStr) and a one-NPU pod.
    assert schedulers.parse_local_ranks("0,1,2,3") == [0, 1, 2, 3] == schedulers.parse_local_ranks("{0,1,2,3}")
    one = schedulers.detect({**ASCEND_POD, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"})
    assert one.values["nnodes"] == 2 and one.values["nproc"] == 1


@pytest.mark.parametrize(("change", "message"), [
    ({"LOCAL_WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE=2 but LOCAL_RANK='{0,1,2,3}' lists 4 local ranks"),
    ({"WORLD_SIZE": "6"}, "WORLD_SIZE=6 is not a multiple of the 4 NPUs per pod"),
    ({"LOCAL_RANK": "{0,x}"}, "LOCAL_RANK='{0,x}' is not a list of local ranks"),
    ({"RANK": "one"}, "RANK='one' is not an integer"),
])
def test_an_ascendjob_that_contradicts_itself_is_refused(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        schedulers.detect({**ASCEND_POD, **change})


def test_volcano_pytorch_plugin_gives_the_pod_rank_and_world_in_pods() -> None:
    env = {"VC_TASK_INDEX": "0", "VC_MASTER_HOSTS": "job-master-0.job", "VC_WORKER_HOSTS": "job-worker-0.job",
           "VC_MASTER_NUM": "1", "VC_WORKER_NUM": "1", "RANK": "1", "WORLD_SIZE": "2",
           "MASTER_ADDR": "job-master-0.job", "MASTER_PORT": "23456"}
    found = schedulers.detect(env)
    assert found.scheduler is Scheduler.VOLCANO
    assert found.values == {"nnodes": 2, "node_rank": 1, "addr": "job-master-0.job", "port": 23456}


def test_volcano_without_the_plugin_orders_master_first_and_finds_this_pod_by_name() -> None:
    me = socket.gethostname().split(".")[0]
    one_task = schedulers.detect({"VC_TASK_INDEX": "2", "VC_WORKER_HOSTS": "w-0.j,w-1.j,w-2.j", "VC_WORKER_NUM": "3"})
    assert one_task.values == {"nnodes": 3, "addr": "w-0.j", "node_rank": 2}
    two_tasks = schedulers.detect({"VC_TASK_INDEX": "0", "VC_WORKER_HOSTS": f"w-0.j,{me}.j", "VC_MASTER_HOSTS": "m-0.j"})
    assert two_tasks.values == {"nnodes": 3, "addr": "m-0.j", "node_rank": 2}
    with pytest.raises(ValueError, match="enable Volcano's pytorch plugin or pass --node-rank"):
        schedulers.detect({"VC_TASK_INDEX": "0", "VC_WORKER_HOSTS": "w-0.j", "VC_MASTER_HOSTS": "m-0.j"})


def test_kubeflow_ray_slurm_and_plain_variables() -> None:
    assert schedulers.detect({"PET_NNODES": "1:4", "PET_NODE_RANK": "3", "PET_MASTER_ADDR": "m"}).values == {
        "nnodes": 4, "node_rank": 3, "addr": "m"}
    ray = schedulers.detect({"RAY_JOB_ID": "02000000", "ASCEND_RT_VISIBLE_DEVICES": "4,5"})
    assert ray.scheduler is Scheduler.RAY and ray.values == {"nproc": 2} and ray.device == "npu"
    train = schedulers.detect({"RAY_RAYLET_PID": "9", "RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.2",
                               "MASTER_PORT": "29600", "ASCEND_RT_VISIBLE_DEVICES": "1"})
    assert train.values == {"nproc": 1, "nnodes": 4, "node_rank": 3, "addr": "10.0.0.2", "port": 29600}
    slurm = schedulers.detect({"SLURM_JOB_ID": "5", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert slurm.scheduler is Scheduler.SLURM and slurm.values["addr"] == "n1"
    plain = schedulers.detect({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29501"})
    assert plain.scheduler is Scheduler.ENV and plain.values == {"nnodes": 2, "node_rank": 1, "addr": "h", "port": 29501}
    # torchrun's per-process variables alone are no scheduler: RANK is never read as a node rank there.
    assert schedulers.detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}).scheduler is Scheduler.NONE
    table = schedulers.detect({"RANK_TABLE_FILE": "/x/hccl.json"})
    assert table.scheduler is Scheduler.RANKTABLE and table.rank_table == "/x/hccl.json"
    assert schedulers.detect({**ASCEND_POD, "RANK_TABLE_FILE": "/x/hccl.json"}).rank_table == "/x/hccl.json"


def test_job_ids_from_the_scheduler() -> None:
    assert schedulers.job_id_from_env({"MINDX_TASK_ID": "7f3c"}) == "ascendjob-7f3c"
    assert schedulers.job_id_from_env({"RAY_JOB_ID": "02000000"}) == "ray-02000000"
    assert schedulers.job_id_from_env({"SLURM_JOB_ID": "5", "MINDX_TASK_ID": "x"}) == "slurm-5"


# ----------------------------------------------------------------------------- rank table layouts

V12 = {
    "status": "completed", "version": "1.2", "server_count": "2",
    "server_list": [
        {"server_id": "10.0.0.2", "host_ip": "10.0.0.2", "container_ip": "172.16.0.9",
         "device": [{"device_id": "1", "device_ip": "192.168.2.9", "super_device_id": "1", "rank_id": "2"},
                    {"device_id": "0", "device_ip": "192.168.2.8", "super_device_id": "0", "rank_id": "3"}]},
        {"server_id": "10.0.0.1", "host_ip": "10.0.0.1", "container_ip": "172.16.0.5",
         "device": [{"device_id": "0", "device_ip": "192.168.1.8", "super_device_id": "0", "rank_id": "0"},
                    {"device_id": "1", "device_ip": "192.168.1.9", "super_device_id": "1", "rank_id": "1"}]},
    ],
    "super_pod_list": [{"super_pod_id": "0", "server_list": [{"server_id": "10.0.0.1"}, {"server_id": "10.0.0.2"}]}],
}
V10_SERVERS = {"status": "completed", "version": "1.0", "server_count": "1", "server_list": [
    {"server_id": "node_0", "device": [{"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"},
                                       {"device_id": "1", "device_ip": "192.168.1.9", "rank_id": "1"}]}]}
V10_GROUPS = {"status": "completed", "group_count": "1", "group_list": [{
    "group_name": "job", "device_count": "4", "instance_count": "2", "instance_list": [
        {"pod_name": "job-0", "server_id": "10.0.0.1",
         "devices": [{"device_id": "0", "device_ip": "192.168.1.8"}, {"device_id": "1", "device_ip": "192.168.1.9"}]},
        {"pod_name": "job-1", "server_id": "10.0.0.2",
         "devices": [{"device_id": "0", "device_ip": "192.168.2.8"}, {"device_id": "1", "device_ip": "192.168.2.9"}]},
    ]}]}


def test_rank_table_v12_orders_servers_by_first_rank_and_devices_by_id() -> None:
    table = ranktable.parse(json.dumps(V12), "hccl.json")
    assert table is not None and table.version == "1.2" and table.world_size == 4
    first, second = table.servers
    assert first.name() == "10.0.0.1" and first.address() == "172.16.0.5" and first.ranks == (0, 1)
    assert second.device_ids == (0, 1) and second.ranks == (3, 2)  # local rank 0 drives device 0: rank 3
    assert table.this_server(node_rank=1) is second  # no address of this host: the node rank picks


def test_rank_table_v10_layouts() -> None:
    servers = ranktable.parse(json.dumps(V10_SERVERS), "hccl.json")
    assert servers is not None and [s.ranks for s in servers.servers] == [(0, 1)]
    groups = ranktable.parse(json.dumps(V10_GROUPS), "hccl.json")
    assert groups is not None and [s.ranks for s in groups.servers] == [(0, 1), (2, 3)]
    assert [s.name() for s in groups.servers] == ["10.0.0.1", "10.0.0.2"]
    mine = json.loads(json.dumps(V10_GROUPS))
    mine["group_list"][0]["instance_list"][1]["pod_name"] = socket.gethostname()
    table = ranktable.parse(json.dumps(mine), "hccl.json")
    assert table is not None and table.this_server(node_rank=None).ranks == (2, 3)  # found by its pod name


@pytest.mark.parametrize(("text", "ready"), [
    ('{"status": "initializing", "server_list": []}', False),
    ('{"status": "completed", "server_li', False),  # half written
    ("", False),
])
def test_a_rank_table_that_is_not_complete_is_not_read(text: str, ready: bool) -> None:
    assert (ranktable.parse(text, "hccl.json") is not None) is ready


@pytest.mark.parametrize(("change", "message"), [
    ({"server_count": "3"}, "server_count is 3 but server_list has 2 servers"),
    ({"server_list": [{"server_id": "a", "device": [{"device_id": "0", "rank_id": "1"}]}], "server_count": "1"},
     r"rank_id values are not 0-0 once each"),
    ({"server_list": [{"server_id": "a", "device": [{"device_id": "x", "rank_id": "0"}]}], "server_count": "1"},
     "device_id is 'x'"),
])
def test_a_complete_rank_table_that_cannot_work_is_refused(change: dict, message: str) -> None:
    with pytest.raises(ranktable.RankTableError, match=message):
        ranktable.parse(json.dumps({**V12, **change}), "hccl.json")


def test_the_wait_ends_when_another_thread_completes_the_table(tmp_path: Path) -> None:
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps({"status": "initializing"}))
    waiting = threading.Event()
    result: dict = {}

    def waiter() -> None:
        result["table"] = ranktable.wait_for_table(str(path), HANG_GUARD_S, lambda status: waiting.set())

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(HANG_GUARD_S), "the launcher never started waiting"
    assert "table" not in result  # it is still waiting: the table says initializing
    path.write_text(json.dumps(V10_SERVERS))  # the operator rewrites the file in place
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive() and result["table"].servers[0].ranks == (0, 1)


# ----------------------------------------------------------------------------- the launcher


def launch(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npu_migrate.launch", *args], env=child_env(**env), cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_print_env_shows_the_scheduler_and_its_variables() -> None:
    result = launch("--print-env", str(JOB), **ASCEND_POD)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("scheduler: MindCluster AscendJob\n  MINDX_TASK_ID=7f3c\n  RANK=1\n")
    assert "gives: nnodes=2, node_rank=1, nproc=4, addr=10.96.0.12, port=2222" in out
    assert "HCCL host ports: 60000-60015 (HCCL_IF_BASE_PORT unset: HCCL's default)" in out
    assert "HCCL_CONNECT_TIMEOUT=(unset)" in out


@pytest.mark.slow
def test_dry_run_inside_an_ascendjob_gives_this_pods_global_ranks() -> None:
    env = {**ASCEND_POD, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29590"}
    result = launch("--dry-run", str(JOB), **env)
    assert result.returncode == 0, result.stderr
    assert "world: 2 node(s) x 4 process(es) = 8 rank(s)" in result.stdout
    assert ("settings from MindCluster AscendJob (MINDX_TASK_ID, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
            "MASTER_ADDR, MASTER_PORT): nnodes, node_rank, device_num, addr, port") in result.stdout
    assert [line.split()[2] for line in result.stdout.splitlines() if line.startswith("   1 ")] == ["4", "5", "6", "7"]
    # Node 0 of an AscendJob meets the others at its Service's address, which is not one of its own.
    result = launch("--dry-run", str(JOB), **{**ASCEND_POD, "RANK": "0", "MASTER_ADDR": "192.0.2.77"})
    assert result.returncode == 0, result.stderr
    assert "master 192.0.2.77:2222" in result.stdout


@pytest.mark.slow
def test_a_cpu_device_num_far_beyond_the_cores_is_refused_in_one_line() -> None:
    result = launch("--dry-run", "--device-num", "1000000", str(JOB))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npu-migrate launch: error: --device-num 1000000 is more than ")
    assert "CPU processes (16 per core" in lines[0]


def test_a_rank_table_that_disagrees_with_the_job_is_one_line_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(V12))
    cases = [
        (("--device-num", "3", "--node-rank", "0"), {},
         "--device-num 3 process(es) on this node, but the rank table"),
        (("--nnodes", "3", "--node-rank", "0"), {}, "--nnodes 3 node(s), but the rank table"),
        ((), {**ASCEND_POD, "RANK": "0"}, "MindCluster AscendJob's 4 process(es) on this node, but the rank table"),
        (("--node-rank", "1"), {"ASCEND_VISIBLE_DEVICES": "4,5"}, "ASCEND_VISIBLE_DEVICES=4,5 but the rank table"),
    ]
    for args, env, message in cases:
        result = launch("--dry-run", *args, str(JOB), RANK_TABLE_FILE=str(path), **env)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, lines)
        assert str(path) in lines[0]


def test_a_rank_table_never_completed_ends_the_wait_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps({"status": "initializing"}))
    result = launch("--dry-run", "--rank-table-timeout", "0.5", str(JOB), RANK_TABLE_FILE=str(path))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"npu-migrate launch: error: rank table {path} is still 'initializing' after 0.5 s (--rank-table-timeout): "
        "the operator writes it once every pod of the job has its NPUs; check the other pods, or wait longer "
        "with --rank-table-timeout or NPU_MIGRATE_RANK_TABLE_TIMEOUT.")


@pytest.mark.slow
def test_a_two_pod_ascendjob_on_loopback_gets_global_ranks_0_to_3(tmp_path: Path) -> None:
    port = free_port()
    pods = [Launch(tmp_path, "--join-timeout", "300", "--node-timeout", "10", str(JOB), name=f"pod{r}",
                   RANK=str(r), WORLD_SIZE="4", LOCAL_RANK="{0,1}", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for r in (0, 1)]
    for pod in pods:
        assert pod.wait() == 0, pod.err
        one_line_errors(pod.err)
        assert ("(settings from MindCluster AscendJob (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, "
                "MASTER_PORT): nnodes, node_rank, device_num, addr, port)") in pod.err
    seen = [(int(r["env"]["RANK"]), int(r["env"]["LOCAL_RANK"]), int(r["env"]["WORLD_SIZE"]), r["env"]["NODE_RANK"])
            for r in reports(tmp_path, 4)]
    assert seen == [(0, 0, 4, "0"), (1, 1, 4, "0"), (2, 0, 4, "1"), (3, 1, 4, "1")]
    assert {r["sum"] for r in reports(tmp_path, 4)} == {10.0}


@pytest.mark.slow
def test_launchers_wait_for_the_rank_table_and_take_its_ranks(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps({"status": "initializing"}))
    table = json.loads(json.dumps(V12))
    for server in table["server_list"]:  # both "pods" on this host
        server.update(server_id="127.0.0.1", host_ip="127.0.0.1", container_ip="127.0.0.1")
    nodes = [Launch(tmp_path, "--node-rank", str(r), "--port", str(port), "--join-timeout", "300",
                    "--node-timeout", "10", str(JOB), name=f"node{r}", RANK_TABLE_FILE=str(path)) for r in (0, 1)]
    for node in nodes:
        wait_for_text(node.stderr, "to be completed")
    path.write_text(json.dumps(table))  # the operator completes it while both launchers wait
    for node in nodes:
        assert node.wait() == 0, node.err
        one_line_errors(node.err)
        assert f"ranks from rank table {path} (version 1.2, 2 server(s))" in node.err
    by_rank = {int(r["env"]["RANK"]): (r["env"]["NODE_RANK"], int(r["env"]["LOCAL_RANK"])) for r in reports(tmp_path, 4)}
    # Node 1's table entry gives device 0 rank 3 and device 1 rank 2.
    assert by_rank == {0: ("0", 0), 1: ("0", 1), 2: ("1", 1), 3: ("1", 0)}


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_while_waiting_for_the_rank_table_ends_in_one_line(inherited: str, tmp_path: Path) -> None:
    """Also when the launcher starts with SIGINT ignored, as a background job of a script does."""
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps({"status": "initializing"}))
    node = Launch(tmp_path, "--device-num", "1", str(JOB), RANK_TABLE_FILE=str(path),
                  sigint_ignored=inherited == "ignored")
    wait_for_text(node.stderr, "to be completed")
    node.proc.send_signal(signal.SIGINT)
    assert node.wait() == 130
    one_line_errors(node.err)
    assert node.err.strip().splitlines()[-1] == (
        f"npu-migrate launch: error: interrupted while waiting for the rank table {path}.")


@pytest.mark.slow
def test_a_scheduler_environment_that_cannot_be_read_is_refused_unless_flags_say_it_all() -> None:
    broken = {**ASCEND_POD, "WORLD_SIZE": "6", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29591"}
    result = launch("--dry-run", str(JOB), **broken)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "npu-migrate launch: error: could not read the cluster environment: WORLD_SIZE=6 is not a multiple of the 4 "
        "NPUs per pod (LOCAL_WORLD_SIZE): expected the job's NPUs, pods x NPUs per pod. Pass --nnodes, --node-rank "
        "and --addr."]
    result = launch("--dry-run", "--nnodes", "2", "--node-rank", "1", "--addr", "127.0.0.1", "--device-num", "1",
                    str(JOB), **broken)
    assert result.returncode == 0, result.stderr
