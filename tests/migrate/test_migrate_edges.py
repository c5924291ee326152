"""Runtime migration at its edges: the fork server, child interpreters, sitecustomize, and the state it keeps.

Real processes throughout: a launcher with its fork server and workers, ``npu-migrate run`` with the
child Pythons a job starts. The simulated NPU (tests/fake_npu) records which process imported it and
which started its runtime, and refuses, like a real accelerator, to start again in a child forked
after its parent started it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, ROOT, child_env, run_cli
from support import Launch, reports

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


@pytest.mark.slow
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


def _migrated_env(**extra: str) -> dict[str, str]:
    """The environment ``npu-migrate run --device cpu --device-num 2`` gives the Pythons its job starts."""
    from npu_migrate.migrate.environment import export_environment

    env = child_env(**extra)
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        export_environment("cpu", 2)
        return dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _python(argv: list[str], env: dict[str, str], *pythonpath: str) -> subprocess.CompletedProcess:
    env = dict(env, PYTHONPATH=os.pathsep.join(pythonpath))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_child_pythons_keep_their_sitecustomize_and_foreign_ones_stay_quiet(tmp_path: Path) -> None:
    broken, good = tmp_path / "broken_site", tmp_path / "good_site"
    broken.mkdir()
    good.mkdir()
    (broken / "sitecustomize.py").write_text("raise RuntimeError('broken on purpose')\n")
    (good / "sitecustomize.py").write_text("import os\nos.environ['SYSTEM_SITE_RAN'] = '1'\n")
    env = _migrated_env()
    path = env["PYTHONPATH"].split(os.pathsep)
    ours = [p for p in path if p.endswith("_bootstrap")]
    # A broken system sitecustomize on the path: reported as Python reports it; migration still on.
    done = _python([sys.executable, "-c", "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"],
                   env, *path, str(broken))
    assert (done.returncode, done.stdout.split()) == (0, ["True", "2"]), done.stderr
    assert "Error in sitecustomize" in done.stderr and "broken on purpose" in done.stderr
    assert "npu_migrate" not in done.stderr
    # A working one is imported as `sitecustomize` itself (no torch needed to see it).
    done = _python([sys.executable, "-c", "import os, sitecustomize; print(sitecustomize.__file__, os.environ['SYSTEM_SITE_RAN'])"],
                   env, *path, str(good))
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, [str(good / "sitecustomize.py"), "1"], "")
    if not os.path.exists(FOREIGN_PYTHON) or os.path.realpath(FOREIGN_PYTHON) == os.path.realpath(sys.executable):
        return
    # Another interpreter: without npu_migrate (installed in the job's environment only), and with
    # npu_migrate importable from the path; neither says anything.
    for pythonpath in (ours, path):
        done = _python([FOREIGN_PYTHON, "-c", "print('foreign ok')"], env, *pythonpath)
        assert (done.returncode, done.stdout, done.stderr) == (0, "foreign ok\n", ""), pythonpath


# --------------------------------------------------------------------------- state kept by the migration


def _patched_state() -> dict[str, dict[str, int]]:
    from support import snapshot

    return snapshot()


def test_current_device_is_per_thread() -> None:
    import threading

    import torch

    from npu_migrate import migrate

    seen: dict[str, object] = {}
    both_set = threading.Barrier(2)

    def use(name: str, index: int) -> None:
        torch.cuda.set_device(index)
        both_set.wait(timeout=60)  # both threads have set theirs before either reads
        seen[name] = (torch.cuda.current_device(), torch.zeros(1, device="cuda").device.type)

    with migrate.enabled(device="cpu", device_count=3):
        torch.cuda.set_device(2)
        threads = [threading.Thread(target=use, args=(f"t{i}", i)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fresh = threading.Thread(target=lambda: seen.setdefault("fresh", torch.cuda.current_device()))
        fresh.start()
        fresh.join()
        with torch.cuda.device(1):
            seen["inside"] = torch.cuda.current_device()
        seen["main"] = torch.cuda.current_device()
    assert seen == {"t0": (0, "cpu"), "t1": (1, "cpu"), "fresh": 0, "inside": 1, "main": 2}


def test_install_is_all_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import torch

    from npu_migrate import migrate
    from npu_migrate.errors import NpuMigrateError

    before, env_before = _patched_state(), dict(os.environ)
    monkeypatch.setenv("NPU_MIGRATE_SIM_DEVICES", "two")
    with pytest.raises(NpuMigrateError, match=r"NPU_MIGRATE_SIM_DEVICES='two' is not a number of devices"):
        migrate.install(device="cpu", propagate=True)
    assert not migrate.is_installed() and _patched_state() == before
    monkeypatch.delenv("NPU_MIGRATE_SIM_DEVICES")
    assert dict(os.environ) == env_before

    class ReadOnly(types.ModuleType):
        """A module whose attributes cannot be replaced: the patching fails part-way."""

        def __setattr__(self, name: str, value: object) -> None:
            raise AttributeError(f"{name} is read-only")

    nvtx = ReadOnly("torch.cuda.nvtx")
    for name, value in vars(torch.cuda.nvtx).items():
        if not name.startswith("__"):
            types.ModuleType.__setattr__(nvtx, name, value)
    monkeypatch.setattr(torch.cuda, "nvtx", nvtx)
    before = _patched_state()
    with pytest.raises(NpuMigrateError, match=r"could not be installed.*read-only.*nothing was changed"):
        migrate.install(device="cpu", device_count=2, propagate=True)
    assert not migrate.is_installed() and _patched_state() == before and dict(os.environ) == env_before
    assert torch.cuda.is_available() is False


@pytest.mark.slow
def test_a_bad_setting_stops_the_script_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "job.py"
    script.write_text(f"import torch\nopen({str(marker)!r}, 'w').close()\n")
    result = run_cli("run", "--device", "cpu", str(script), env=child_env(NPU_MIGRATE_SIM_DEVICES="0"))
    assert result.returncode == 2 and not marker.exists()
    assert result.stderr.strip().splitlines() == [
        "npu-migrate: error: NPU_MIGRATE_SIM_DEVICES='0' is not a number of devices: expected a whole number, "
        "1 or more. Set it to how many cuda devices the script should see on cpu, or unset it."
    ]
    # A Python started by a migrated job, with the bad setting: it stops at `import torch` and says why.
    env = dict(_migrated_env(), NPU_MIGRATE_SIM_DEVICES="two")
    child = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 2 and not marker.exists()
    assert child.stderr.strip().splitlines() == [
        "npu_migrate: runtime migration could not be installed: NPU_MIGRATE_SIM_DEVICES='two' is not a number of "
        "devices: expected a whole number, 1 or more. Set it to how many cuda devices the script should see on cpu, "
        "or unset it."
    ]


def test_torch_load_keeps_positional_arguments(tmp_path: Path) -> None:
    import pickle
    import types

    import torch

    from npu_migrate import migrate

    used: list[str] = []

    class Unpickler(pickle.Unpickler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            used.append("Unpickler")
            super().__init__(*args, **kwargs)

    recording = types.SimpleNamespace(Unpickler=Unpickler, load=pickle.load, dump=pickle.dump, Pickler=pickle.Pickler,
                                      __name__="recording_pickle")
    path = tmp_path / "t.pt"
    torch.save({"w": torch.arange(3.0)}, path)
    with migrate.enabled(device="cpu", device_count=2):
        got = torch.load(path, "cuda:1", recording, weights_only=False)
        assert used == ["Unpickler"] and got["w"].device.type == "cpu"
        got = torch.load(path, "cuda", recording, weights_only=False)
        assert used == ["Unpickler", "Unpickler"] and got["w"].tolist() == [0.0, 1.0, 2.0]
        assert torch.load(path, map_location="cuda:0", weights_only=True)["w"].device.type == "cpu"


def test_event_and_stream_stand_ins_behave_like_the_classes() -> None:
    import torch

    from npu_migrate import migrate

    with migrate.enabled(device="cpu", device_count=2):

        class TimedEvent(torch.cuda.Event):
            def __init__(self) -> None:
                super().__init__(enable_timing=True)
                self.label = "step"

        class MyStream(torch.cuda.Stream):
            pass

        start, end = TimedEvent(), TimedEvent()
        assert type(start) is TimedEvent and start.label == "step" and start.enable_timing
        assert isinstance(start, torch.cuda.Event)
        start.record()
        end.record()
        end.synchronize()
        assert start.elapsed_time(end) >= 0.0 and end.query()
        event = torch.cuda.Event(enable_timing=True, blocking=True)
        assert (event.enable_timing, event.blocking, event.interprocess) == (True, True, False)
        stream = torch.cuda.Stream(priority=-1)
        assert type(MyStream()) is MyStream and isinstance(stream, torch.cuda.Stream)
        assert stream.priority == -1 and stream.query() and stream.device.type == "cpu"
        stream.wait_event(event)
        stream.wait_stream(torch.cuda.current_stream())
        assert isinstance(stream.record_event(), torch.cuda.Event)
        assert torch.cuda.Stream.priority_range() == (0, 0) and callable(torch.cuda.Event.elapsed_time)
        with torch.cuda.stream(stream):
            pass


NPU_SCRIPT = """
import json, threading
import torch

torch.cuda.set_device(1)
out = {}

def where():
    x = torch.zeros(1, device="cuda")
    return [torch.cuda.current_device(), str(x.device), str(x.cpu().to("cuda").device), str(x.cpu().cuda().device)]

def other_thread():
    out["thread"] = where()

t = threading.Thread(target=other_thread)
t.start()
t.join()
out["main"] = where()
torch.cuda.nvtx.range_push("step {}".format(1))
torch.cuda.nvtx.range_pop()
with torch.cuda.nvtx.range("epoch {}", 3):
    pass
torch.cuda.nvtx.mark("here")
torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("span"))
out["mstx"] = torch.npu.mstx.calls

class TimedEvent(torch.cuda.Event):
    pass

event = TimedEvent(enable_timing=True)
stream = torch.cuda.Stream()
out["event"] = [type(event).__name__, isinstance(event, torch.cuda.Event), event.enable_timing]
out["stream"] = [str(stream.device), stream.priority, stream.query()]
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.fake_npu
def test_on_npu_threads_nvtx_events_and_streams_keep_their_meaning(tmp_path: Path) -> None:
    script = tmp_path / "npu_job.py"
    script.write_text(NPU_SCRIPT)
    result = run_cli("run", str(script), env=child_env(FAKE_NPU, ASCEND_RT_VISIBLE_DEVICES="0,1"))
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.splitlines()[-1])
    # "cuda" alone is the calling thread's current device, however it is passed, every time.
    assert got["thread"] == [0, "npu:0", "npu:0", "npu:0"] and got["main"] == [1, "npu:1", "npu:1", "npu:1"]
    assert got["mstx"] == [["range_start", "step 1"], ["range_end", 1], ["range_start", "epoch 3"], ["range_end", 3],
                           ["mark", "here"], ["range_start", "span"], ["range_end", 6]]
    assert got["event"] == ["TimedEvent", True, True]
    assert got["stream"] == ["npu:1", 0, True]


# --------------------------------------------------------------------------- who is the user

ASKING_MODULE = """
import torch

def ask():
    return torch.cuda.is_available()

def run_generated():
    scope = {}
    exec(compile("import torch\\nanswer = torch.cuda.is_available()", "<string>", "exec"), scope)
    return scope["answer"]
"""


def _site_packages(tmp_path: Path) -> Path:
    """A site-packages folder as ``pip install --target`` leaves it: the user's package and a library."""
    site = tmp_path / "env" / "site-packages"
    for name in ("userpkg", "libpkg"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(ASKING_MODULE)
    return site


def test_installed_user_package_and_generated_code_are_classified_by_who_runs_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_migrate import migrate
    from npu_migrate.migrate.report import REPORT

    site = _site_packages(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    import libpkg
    import userpkg

    def generated_here() -> bool:
        scope: dict = {}
        exec(compile("import torch\nanswer = torch.cuda.is_available()", "<string>", "exec"), scope)  # noqa: S102
        return scope["answer"]

    with migrate.enabled(device="cpu"):
        # installed, so a library by default; generated code is whoever ran it
        assert (userpkg.ask(), libpkg.ask(), generated_here(), libpkg.run_generated()) == (False, False, True, False)
    REPORT.reset()
    monkeypatch.setenv("NPU_MIGRATE_USER_CODE", os.pathsep.join(["userpkg", str(tmp_path / "elsewhere")]))
    with migrate.enabled(device="cpu"):
        assert (userpkg.ask(), userpkg.run_generated(), libpkg.ask(), libpkg.run_generated()) == (True, True, False, False)
        report = REPORT.as_dict()
    user_code = {entry["path"]: entry["source"] for entry in report["user_code"]}
    assert user_code[str(site / "userpkg")] == "NPU_MIGRATE_USER_CODE" and str(tmp_path / "elsewhere") in user_code
    entry = report["entries"]["torch.cuda.is_available"]
    assert entry["count"] == 2 and entry["library_calls"] >= 2  # libpkg asked twice and got torch's answer


@pytest.mark.slow
def test_user_code_flag_on_the_command_line(tmp_path: Path) -> None:
    site = _site_packages(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("import json, libpkg, userpkg\nprint(json.dumps([userpkg.ask(), libpkg.ask()]))\n")
    report = tmp_path / "report.json"
    env = child_env(site)
    result = run_cli("run", "--device", "cpu", "--user-code", "userpkg", "--migrate-report", str(report), str(script),
                     env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [True, False]
    merged = json.loads(report.read_text())
    assert {(e["path"], e["source"]) for e in merged["user_code"]} >= {(str(site / "userpkg"), "--user-code"),
                                                                       (str(tmp_path), "script")}
    from npu_migrate.launch.cli import build_parser

    args = build_parser().parse_args(["--migrate", "--user-code", "userpkg", "--user-code", "src", "train.py"])
    assert args.user_code == ["userpkg", "src"]


def test_wrappers_called_while_migration_is_off_raise_migration_error_even_under_python_O(monkeypatch: pytest.MonkeyPatch) -> None:
    # Explicit checks, not asserts: `python -O` would drop an assert and fail later with an AttributeError.
    from npu_migrate.errors import MigrationError
    from npu_migrate.migrate import mapping
    from npu_migrate.migrate.patches import accelerator, cuda_namespace, data_amp, streams
    from npu_migrate.migrate.state import STATE

    monkeypatch.setattr(STATE, "target", None)
    calls = {"target_device()": lambda: mapping.target_device(0), "map_backend()": lambda: mapping.map_backend("nccl"),
             "new_grad_scaler()": data_amp.new_grad_scaler, "install_nvtx()": streams.install_nvtx,
             "cuda_namespace.install()": cuda_namespace.install,
             "the torch.accelerator patches": accelerator._install_namespace}
    for what, call in calls.items():
        with pytest.raises(MigrationError, match=rf"^{re.escape(what)} needs runtime migration, which is not installed "
                                                 r"in this process: call npu_migrate\.migrate\.install\(\) first"):
            call()
