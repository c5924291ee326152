"""The launcher's fork server: forked from the launcher after its one ``import torch``, or a new interpreter.

Real launchers and ranks; each rank reports its parent (the fork server) as ``ps`` would show it.
The simulated NPU (tests/fake_npu) records which process imported it and which started its
runtime: the fork server must do neither, whichever way it started.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import FAKE_NPU
from support import Launch, reports

RANK_LINE = re.compile(r"^\[\S+ node0 rank(\d)\] ")
"""A line a rank wrote, relayed with its prefix (``[host node0 rank1] ...``)."""

PARENT_JOB = """
import json, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
    server_argv = [a.decode() for a in fh.read().split(b"\\0") if a]
with open(f"/proc/{os.getppid()}/status") as fh:
    server_parent = int(next(line.split()[1] for line in fh if line.startswith("PPid:")))
dist.destroy_process_group()
with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"pid": os.getpid(), "server": os.getppid(), "server_argv": server_argv,
               "server_parent": server_parent, "sum": x.item()}, fh)
"""


@pytest.mark.slow
@pytest.mark.fake_npu
@pytest.mark.parametrize("method", ["forkserver", "forkserver-fresh"])
def test_the_fork_server_is_the_launcher_forked_unless_asked_otherwise(tmp_path: Path, method: str) -> None:
    """By default the fork server is the launcher itself, forked once it imported torch (one import
    per job); ``NPU_MIGRATE_START_METHOD=forkserver-fresh`` keeps multiprocessing's new interpreter.
    Either way the launcher is its parent, it forks every rank, and it never touches the device."""
    script = tmp_path / "job.py"
    script.write_text(PARENT_JOB)
    events = tmp_path / "npu_events.txt"
    args = ("--device-num", "2", str(script))
    job = Launch(tmp_path, *args, paths=(FAKE_NPU,), ASCEND_RT_VISIBLE_DEVICES="0,1",
                 FAKE_NPU_EVENTS=str(events), NPU_MIGRATE_START_METHOD=method)
    assert job.wait() == 0, job.err
    got = reports(tmp_path, 2)
    assert [r["sum"] for r in got] == [2.0, 2.0]
    servers = {r["server"] for r in got}
    assert len(servers) == 1 and job.proc.pid not in servers
    assert {r["server_parent"] for r in got} == {job.proc.pid}
    argv = got[0]["server_argv"]
    if method == "forkserver":
        assert argv[1:] == ["-m", "npu_migrate.launch", *args], argv  # the launcher's own command line
    else:
        assert "from multiprocessing.forkserver import main" in argv[argv.index("-c") + 1], argv
    seen = [line.split() for line in events.read_text().splitlines()]
    assert not [e for e in seen if int(e[1]) in servers], seen  # no torch_npu, no runtime in the fork server
    assert {int(pid) for what, pid in seen if what == "init"} >= {r["pid"] for r in got}
    assert ["import", str(job.proc.pid)] in seen  # the launcher loaded torch_npu itself, after the fork


@pytest.mark.slow
@pytest.mark.parametrize("level", [None, "INFO"])
def test_ranks_keep_the_users_cpp_log_level_and_the_launcher_stays_quiet(tmp_path: Path, level: str | None) -> None:
    """torch loads once for the launcher and its fork server, with the user's TORCH_CPP_LOG_LEVEL:
    the ranks log at that level; unset, neither the launcher nor a rank shows c10d's INFO lines."""
    script = tmp_path / "job.py"
    script.write_text(PARENT_JOB)
    env = {"TORCH_CPP_LOG_LEVEL": level} if level else {}
    job = Launch(tmp_path, "--device-num", "2", str(script), **env)
    assert job.wait() == 0, job.err
    connected = [RANK_LINE.match(line) for line in job.err.splitlines()
                 if "[c10d] The client socket has connected" in line]
    if level:
        assert {m.group(1) for m in connected if m} == {"0", "1"}, job.err
    else:
        assert "[c10d]" not in job.err, job.err
    assert [json.loads((tmp_path / f"rank{r}.json").read_text())["sum"] for r in (0, 1)] == [2.0, 2.0]


def test_only_multiprocessing_s_own_fork_server_command_is_run_in_the_fork() -> None:
    """The forked child runs ``main`` with the literals multiprocessing wrote (Python 3.9 to 3.14's
    forms); anything else is never executed, and multiprocessing starts its new interpreter."""
    from npu_migrate.launch.procs import forkserver

    head = "from multiprocessing.forkserver import main; "
    assert forkserver._server_call(["python", "-B", "-c", head + "main(3, 5, ['npu_migrate._preload'], **{})"]) == (
        [3, 5, ["npu_migrate._preload"]], {})
    assert forkserver._server_call(
        ["python", "-c", head + "main(3, 5, ['m'], **{'sys_path': ['/a'], 'authkey_r': 7})"]) == (
        [3, 5, ["m"]], {"sys_path": ["/a"], "authkey_r": 7})
    for command in (head + "main(__import__('os').system('true'))", "from os import main; main(1)",
                    "import os; os.system('true')", head + "main(1); main(2)", head + "main(*[1])", "main(1"):
        with pytest.raises(forkserver._Unreadable):
            forkserver._server_call(["python", "-c", command])


FEATURE_JOB = """
import json, os
import torch
import torch.distributed as dist

dist.init_process_group("nccl" if os.environ["CASE"] == "migrate" else "gloo")
device = torch.device("cuda" if os.environ["CASE"] == "migrate" else "cpu")
model = torch.nn.Linear(3, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.ones(4, 3, device=device)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
x = torch.ones(1, device=device)
dist.all_reduce(x)
with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
    server_argv = [a.decode() for a in fh.read().split(b"\\0") if a]
dist.destroy_process_group()
with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"server_argv": server_argv, "sum": x.item()}, fh)
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["migrate", "probe"])
def test_migration_and_the_probe_arm_in_a_fork_server_forked_from_the_launcher(tmp_path: Path, case: str) -> None:
    """``--migrate`` and ``--probe`` export a start-up hook for the workers; the launcher still forks
    its fork server from itself (one import of torch), which arms the hook a new interpreter would."""
    script = tmp_path / "job.py"
    script.write_text(FEATURE_JOB)
    flags = (["--migrate", "--migrate-report", str(tmp_path / "report.json")] if case == "migrate"
             else ["--probe", str(tmp_path / "probe")])
    args = ("--device", "cpu", "--device-num", "2", *flags, str(script))
    job = Launch(tmp_path, *args, CASE=case)
    assert job.wait() == 0, job.err
    got = reports(tmp_path, 2)
    assert [r["sum"] for r in got] == [2.0, 2.0]
    assert {tuple(r["server_argv"][1:]) for r in got} == {("-m", "npu_migrate.launch", *args)}
    if case == "migrate":  # every rank's CUDA calls went to the CPU, and said so
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["processes"] == 2 and report["targets"] == ["cpu"], report
        assert {api: row["processes"] for api, row in report["apis"].items()} == {
            "init_process_group(backend=)": 2, "Module.to": 2, "torch.ones(device=)": 2}, report
    else:  # every rank recorded its two optimizer steps
        for rank in (0, 1):
            steps = [json.loads(line) for line in (tmp_path / "probe" / f"rank{rank}.jsonl").read_text().splitlines()]
            assert len([s for s in steps if s.get("kind") == "step"]) == 2, steps
