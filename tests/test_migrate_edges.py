"""Runtime migration at its edges: the fork server, child interpreters, sitecustomize, and the state it keeps.

Real processes throughout: a launcher with its fork server and workers, ``npu-migrate run`` with the
child Pythons a job starts. The simulated NPU (tests/fake_npu) records which process imported it and
which started its runtime, and refuses, like a real accelerator, to start again in a child forked
after its parent started it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, child_env, run_cli
from launch_support import Launch, reports

FOREIGN_PYTHON = "/usr/bin/python3"

TORCHRUN_JOB = """
import json, os
import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
x = torch.ones(2, device="cuda") * (dist.get_rank() + 1)
dist.all_reduce(x)
out = {"pid": os.getpid(), "ppid": os.getppid(), "sum": x.sum().item(), "device": str(x.device),
       "backend": dist.get_backend()}
dist.destroy_process_group()
with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.fake_npu
def test_fork_server_leaves_the_device_runtime_to_the_workers(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_JOB)
    events = tmp_path / "npu_events.txt"
    job = Launch(tmp_path, "--migrate", "--device-num", "2", str(script), paths=(FAKE_NPU,),
                 ASCEND_RT_VISIBLE_DEVICES="0,1", FAKE_NPU_EVENTS=str(events))
    assert job.wait() == 0, job.err
    assert "re-initialize" not in job.err
    got = reports(tmp_path, 2)
    assert [(r["sum"], r["device"], r["backend"]) for r in got] == [(6.0, "npu:0", "hccl"), (6.0, "npu:1", "hccl")]
    fork_server = {r["ppid"] for r in got}
    assert len(fork_server) == 1 and job.proc.pid not in fork_server  # forked by the fork server
    lines = [line.split() for line in events.read_text().splitlines()]
    assert not [e for e in lines if int(e[1]) in fork_server]  # it neither imported torch_npu nor started the runtime
    assert {int(pid) for what, pid in lines if what == "init"} >= {r["pid"] for r in got}


def test_child_pythons_keep_their_sitecustomize_and_foreign_ones_stay_quiet(tmp_path: Path) -> None:
    broken, good = tmp_path / "broken_site", tmp_path / "good_site"
    broken.mkdir()
    good.mkdir()
    (broken / "sitecustomize.py").write_text("raise RuntimeError('broken on purpose')\n")
    (good / "sitecustomize.py").write_text("import os\nos.environ['SYSTEM_SITE_RAN'] = '1'\n")
    foreign = FOREIGN_PYTHON if os.path.exists(FOREIGN_PYTHON) and os.path.realpath(FOREIGN_PYTHON) != os.path.realpath(sys.executable) else None
    script = tmp_path / "parent.py"
    script.write_text(f"""
import json, os, subprocess, sys

def run(argv, pythonpath):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    return {{"code": done.returncode, "out": done.stdout.split(), "err": done.stderr}}

path = os.environ["PYTHONPATH"].split(os.pathsep)
ours = [p for p in path if p.endswith("_bootstrap")]
out = {{
    # a broken system sitecustomize on the path: reported as Python reports it, migration still on
    "broken": run([sys.executable, "-c", "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"],
                  path + [{str(broken)!r}]),
    # a working one is imported as `sitecustomize` itself, and migration is on
    "good": run([sys.executable, "-c", "import os, sitecustomize, torch; "
                 "print(sitecustomize.__file__, os.environ.get('SYSTEM_SITE_RAN'), torch.cuda.is_available())"],
                path + [{str(good)!r}]),
}}
if {foreign!r}:
    # another interpreter, without npu_migrate (it lives in the job's environment only)
    out["foreign"] = run([{foreign!r}, "-c", "print('foreign ok')"], ours)
    # another interpreter that can import npu_migrate from the path
    out["foreign_path"] = run([{foreign!r}, "-c", "print('foreign ok')"], path)
print(json.dumps(out))
""")
    result = run_cli("run", "--device", "cpu", "--device-num", "2", str(script))
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.splitlines()[-1])
    assert got["broken"]["out"] == ["True", "2"], got["broken"]
    assert "Error in sitecustomize" in got["broken"]["err"] and "broken on purpose" in got["broken"]["err"]
    assert "npu_migrate" not in got["broken"]["err"]
    assert got["good"]["out"] == [str(good / "sitecustomize.py"), "1", "True"], got["good"]
    assert got["good"]["err"] == ""
    if foreign is None:
        return
    for case in ("foreign", "foreign_path"):
        assert (got[case]["code"], got[case]["out"], got[case]["err"]) == (0, ["foreign", "ok"], ""), got[case]
