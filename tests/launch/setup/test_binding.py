"""``--cpu-binding``: the plan on fake sysfs trees (8 NPUs on 2 and 4 NUMA nodes, a cgroup's CPU set), and real jobs.

The plan (:func:`npu_migrate.launch.setup.binding.plan_binding`) reads sysfs under a root the test
gives; the jobs run on this host's CPUs (CPU family) and on the stand-in NPU with a fake tree
(``NPU_MIGRATE_SYSFS_ROOT``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, LAUNCH_SCRIPTS, ROOT, child_env
from npu_migrate.launch.errors import LaunchUsageError
from npu_migrate.launch.setup import binding
from npu_migrate.launch.setup.options import LaunchOptions
from support import Launch

SCRIPT = LAUNCH_SCRIPTS / "affinity_job.py"


def fake_sysfs(root: Path, nodes: list[str], npu_nodes: list[int], *, link: bool = False,
               packages: list[int] | None = None) -> Path:
    """A /sys with NUMA nodes (their cpulists), NPUs as Huawei PCI functions on ``npu_nodes``, and a GPU-less NIC.

    ``link``: the NPUs found through ``class/devdrv-class/davinci<N>/device`` (in reverse bus order, so the
    link, not the bus order, must decide); ``packages``: each node's physical package.
    """
    for k, cpulist in enumerate(nodes):
        (root / "devices/system/node" / f"node{k}").mkdir(parents=True)
        (root / "devices/system/node" / f"node{k}/cpulist").write_text(cpulist + "\n")
        for cpu in binding.parse_cpulist(cpulist):
            topo = root / "devices/system/cpu" / f"cpu{cpu}/topology"
            topo.mkdir(parents=True)
            topo.joinpath("physical_package_id").write_text(f"{(packages or list(range(len(nodes))))[k]}\n")
    pci = root / "bus/pci/devices"
    nic = pci / "0000:01:00.0"
    nic.mkdir(parents=True)
    for name, value in (("vendor", "0x15b3"), ("class", "0x020000"), ("numa_node", "0")):
        (nic / name).write_text(value + "\n")
    count = len(npu_nodes)
    for i, node in enumerate(npu_nodes):
        bus = count - 1 - i if link else i
        dev = pci / f"0000:{0x80 + bus:02x}:00.0"
        dev.mkdir(parents=True)
        for name, value in (("vendor", "0x19e5"), ("class", "0x120000"), ("numa_node", str(node))):
            (dev / name).write_text(value + "\n")
        if link:
            cls = root / "class/devdrv-class" / f"davinci{i}"
            cls.mkdir(parents=True)
            (cls / "device").symlink_to(dev)
    return root


def plan(tmp: Path, mode: str | None, family: str = "npu", devices: list[int] | None = None, count: int = 8,
         allowed: list[int] | None = None, **environ: str) -> binding.Binding:
    devices = list(range(8)) if devices is None else devices
    return binding.plan_binding(mode, family, devices, count, environ, allowed=allowed, sysfs_root=str(tmp))


@pytest.mark.parametrize("link", [False, True])
def test_eight_npus_on_two_numa_nodes_get_their_nodes_cores(tmp_path: Path, link: bool) -> None:
    fake_sysfs(tmp_path, ["0-23,48-71", "24-47,72-95"], [0, 0, 0, 0, 1, 1, 1, 1], link=link)
    got = plan(tmp_path, None, allowed=list(range(96)))  # the NPU family's default: node
    assert got.mode == "node"
    node0, node1 = (*range(24), *range(48, 72)), (*range(24, 48), *range(72, 96))
    assert got.cpus == (node0,) * 4 + (node1,) * 4
    assert got.threads == (12,) * 8  # 48 CPUs shared by 4 ranks
    # torch-npu takes one closed range per NPU: the longest run of each set; force: the launcher owns it
    assert got.conf == "1," + ",".join(f"npu{i}:{'0-23' if i < 4 else '24-47'}" for i in range(8)) + ",force:1"
    assert got.env(5) == {"CPU_AFFINITY_CONF": got.conf, "OMP_NUM_THREADS": "12"}
    assert "each device's NUMA node" in got.note and "rank 4: 24-47,72-95" in got.note


def test_eight_npus_on_four_numa_nodes_and_the_exclusive_and_socket_modes(tmp_path: Path) -> None:
    fake_sysfs(tmp_path, ["0-15", "16-31", "32-47", "48-63"], [0, 0, 1, 1, 2, 2, 3, 3], packages=[0, 0, 1, 1])
    got = plan(tmp_path, "node", allowed=list(range(64)))
    assert got.cpus == tuple(tuple(range(16 * (i // 2), 16 * (i // 2) + 16)) for i in range(8))
    assert got.threads == (8,) * 8
    exclusive = plan(tmp_path, "exclusive", allowed=list(range(64)))
    assert exclusive.cpus == tuple(tuple(range(8 * i, 8 * i + 8)) for i in range(8))  # disjoint halves of each node
    assert exclusive.threads == (8,) * 8
    assert plan(tmp_path, "core-complex", allowed=list(range(64))).cpus == exclusive.cpus
    socket = plan(tmp_path, "socket", allowed=list(range(64)))
    assert socket.cpus == (tuple(range(32)),) * 4 + (tuple(range(32, 64)),) * 4


def test_a_cgroup_cpu_set_is_what_binding_divides(tmp_path: Path) -> None:
    # A container given CPUs 8-15 and 40-47 of a 2-node host: each rank gets its node's part of them.
    fake_sysfs(tmp_path, ["0-31", "32-63"], [0, 0, 0, 0, 1, 1, 1, 1])
    allowed = [*range(8, 16), *range(40, 48)]
    got = plan(tmp_path, "node", allowed=allowed)
    assert got.cpus == (tuple(range(8, 16)),) * 4 + (tuple(range(40, 48)),) * 4
    assert got.threads == (2,) * 8
    assert "npu0:8-15" in got.conf and "npu7:40-47" in got.conf
    # A node none of whose CPUs are allowed: torch-npu's default split of the allowed ones
    lone = plan(tmp_path, "node", allowed=list(range(8, 16)))
    assert lone.cpus[:4] == (tuple(range(8, 16)),) * 4 and lone.cpus[4:] == ((12,), (13,), (14,), (15,))
    assert "1 device(s)" not in lone.note and "4 device(s) with no known node" in lone.note


def test_visible_devices_map_ranks_to_physical_npus(tmp_path: Path) -> None:
    fake_sysfs(tmp_path, ["0-3", "4-7"], [0, 0, 0, 0, 1, 1, 1, 1])
    got = plan(tmp_path, "node", devices=[0, 1], count=2, allowed=list(range(8)), ASCEND_RT_VISIBLE_DEVICES="5,2")
    assert got.cpus == ((4, 5, 6, 7), (0, 1, 2, 3))
    assert got.conf == "1,npu0:4-7,npu1:0-3,force:1"  # torch-npu numbers the visible devices


def test_without_sysfs_torch_npus_default_split_and_the_users_conf_wins(tmp_path: Path) -> None:
    got = plan(tmp_path, None, allowed=list(range(32)))  # no nodes, no devices in this tree
    assert got.cpus == tuple(tuple(range(4 * i, 4 * i + 4)) for i in range(8))  # 32 CPUs ÷ 8 cards
    assert "torch-npu's default" in got.note
    mine = plan(tmp_path, None, allowed=list(range(32)), CPU_AFFINITY_CONF="2")
    assert not mine.active and mine.env(0) == {} and "CPU_AFFINITY_CONF=2" in mine.note
    assert not plan(tmp_path, None, family="cuda").active and not plan(tmp_path, None, family="cpu").active
    assert not plan(tmp_path, "none").active


def test_cpu_family_gets_disjoint_shares(tmp_path: Path) -> None:
    got = plan(tmp_path, "node", family="cpu", devices=[0, 1, 2], count=3, allowed=[0, 1, 2, 3, 4, 5, 6])
    assert got.cpus == ((0, 1, 2), (3, 4), (5, 6)) and got.threads == (3, 2, 2) and got.conf is None
    assert "disjoint shares of the allowed CPUs" in got.note
    # More ranks than CPUs: one each, in turn, and the note does not call them disjoint.
    got = plan(tmp_path, "node", family="cpu", devices=[0, 1, 2, 3], count=4, allowed=[0, 1])
    assert got.cpus == ((0,), (1,), (0,), (1,)) and got.threads == (1, 1, 1, 1)
    assert "4 ranks on 2 allowed CPU(s): one CPU each, shared in turn" in got.note and "disjoint" not in got.note


def test_cpulists_and_the_mode_check() -> None:
    assert binding.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert binding.format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    with pytest.raises(LaunchUsageError, match="--cpu-binding 'nodes' is not one of"):
        LaunchOptions(cpu_binding="nodes").check()


def _reports(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"affinity-rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.slow
def test_two_cpu_ranks_on_two_cores_each_see_one_core_and_one_thread(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) != 2:
        pytest.skip("written for a host whose launcher may use 2 CPUs")
    job = Launch(tmp_path, "--device-num", "2", "--cpu-binding", str(SCRIPT),  # a script after the switch
                 env_drop=("OMP_NUM_THREADS",))  # a user's own would win
    assert job.wait() == 0, job.err
    cpus = sorted(os.sched_getaffinity(0))
    for rank, r in enumerate(_reports(tmp_path, 2)):
        assert r["cpus"] == r["thread_cpus"] == [cpus[rank]] and r["threads"] == 1 and r["omp"] == "1"
        assert r["conf"] is None  # torch-npu's variable is the NPU family's alone
    assert f"CPU binding node (disjoint shares of the allowed CPUs): rank 0: {cpus[0]}; rank 1: {cpus[1]}" in job.err


@pytest.mark.slow
def test_a_launcher_restricted_by_taskset_binds_within_its_cpus(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to restrict the launcher to one")
    last = cpus[-1]
    env = child_env(OUT_DIR=str(tmp_path))
    env.pop("OMP_NUM_THREADS")
    proc = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", "--cpu-binding=exclusive",
                           str(SCRIPT)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, {last}))  # as `taskset -c LAST` would
    assert proc.returncode == 0, proc.stderr
    assert all(r["cpus"] == [last] and r["threads"] == 1 for r in _reports(tmp_path, 2))
    assert f"the launcher may use 1 of the host's {os.cpu_count()}: {last}" in proc.stderr


@pytest.mark.fake_npu
@pytest.mark.slow
def test_npu_ranks_bound_to_their_nodes_on_the_stand_in(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs for 2 NUMA nodes")
    sysfs = fake_sysfs(tmp_path / "sys", [str(cpus[0]), str(cpus[1])], [0, 0, 0, 0, 1, 1, 1, 1], link=True)
    out = tmp_path / "out"
    out.mkdir()
    job = Launch(out, "--device-num", "4", str(SCRIPT), paths=(FAKE_NPU,), ASCEND_RT_VISIBLE_DEVICES="0,1,4,5",
                 NPU_MIGRATE_SYSFS_ROOT=str(sysfs), env_drop=("OMP_NUM_THREADS",))  # on by default on the NPU family
    assert job.wait() == 0, job.err
    conf = f"1,npu0:{cpus[0]}-{cpus[0]},npu1:{cpus[0]}-{cpus[0]},npu2:{cpus[1]}-{cpus[1]},npu3:{cpus[1]}-{cpus[1]},force:1"
    for rank, r in enumerate(_reports(out, 4)):
        assert r["cpus"] == [cpus[rank // 2]] and r["threads"] == 1 and r["conf"] == conf
    assert "CPU binding node (each device's NUMA node)" in job.err
    env_line = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--print-env", str(SCRIPT)], cwd=ROOT,
                              env=child_env(FAKE_NPU, NPU_MIGRATE_SYSFS_ROOT=str(sysfs)), capture_output=True,
                              text=True, timeout=120).stdout
    assert f"davinci0 on node 0" in env_line and "davinci7 on node 1" in env_line


def test_a_gpu_found_by_the_pci_address_cuda_reports(tmp_path: Path) -> None:
    fake_sysfs(tmp_path, ["0-7", "8-15"], [])
    for bus, node in (("0000:1a:00.0", 0), ("0000:9c:00.0", 1)):
        gpu = tmp_path / "bus/pci/devices" / bus
        gpu.mkdir(parents=True)
        for name, value in (("vendor", "0x10de"), ("class", "0x030200"), ("numa_node", str(node))):
            (gpu / name).write_text(value + "\n")
    # CUDA's order (fastest first) may differ from the bus order: its own addresses decide.
    got = binding.plan_binding("node", "cuda", [0, 1], 2, {}, allowed=list(range(16)), sysfs_root=str(tmp_path),
                               bus_ids=["0000:9C:00.0", "0000:1a:00.0"])
    assert got.cpus == (tuple(range(8, 16)), tuple(range(8))) and got.conf is None and got.threads == (8, 8)
    by_order = binding.plan_binding("exclusive", "cuda", [0], 1, {"CUDA_VISIBLE_DEVICES": "1"}, allowed=list(range(16)),
                                    sysfs_root=str(tmp_path))
    assert by_order.cpus == (tuple(range(8, 16)),)  # visible device 0 is the host's GPU 1, on node 1


def test_worker_env_threads_follow_the_set_unless_the_user_set_them() -> None:
    from npu_migrate.launch.setup.config import LaunchConfig

    bound = binding.Binding(mode="node", cpus=((0, 1, 2, 3),), threads=(4,), conf="1,npu0:0-3,force:1")
    env = LaunchConfig(nproc=1, omp_threads=2, binding=bound).worker_env(0)
    assert (env["OMP_NUM_THREADS"], env["CPU_AFFINITY_CONF"]) == ("4", "1,npu0:0-3,force:1")
    assert "OMP_NUM_THREADS" not in LaunchConfig(nproc=1, omp_threads=None, binding=bound).worker_env(0)


@pytest.mark.parametrize(("words", "mode", "script"), [
    (["--cpu-binding", "train.py"], "node", "train.py"),
    (["--cpu-binding", "exclusive", "train.py"], "exclusive", "train.py"),
    (["--cpu-binding=none", "train.py", "--cpu-binding", "x"], "none", "train.py"),  # the script's own words
    (["--numa-binding", "socket", "train.py"], None, "train.py"),
])
def test_the_flag_takes_an_optional_mode(words: list[str], mode: str | None, script: str) -> None:
    from npu_migrate.launch import cli

    args = cli.build_parser().parse_args(words)
    assert (args.cpu_binding, args.script) == (mode, script)


def test_a_mode_that_is_none_of_them_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from npu_migrate.launch import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--cpu-binding", "nodes", "train.py"])
    assert "--cpu-binding" in capsys.readouterr().err


def test_the_dry_run_says_what_would_be_bound() -> None:
    from npu_migrate.launch.setup.config import LaunchConfig, world_table
    from npu_migrate.launch.setup.target import Target

    bound = binding.Binding(mode="node", cpus=((0,), (1,)), threads=(1, 1), note="CPU binding node (...): rank 0: 0")
    table = world_table(LaunchConfig(nproc=2, omp_threads=1, binding=bound), Target(script="t.py"))
    assert "\nCPU binding node (...): rank 0: 0\n" in table and "OMP_NUM_THREADS=1" in table
