"""Shared fixtures: a clean environment per test, free ports, real multi-process jobs, S3 on loopback.

Multi-process tests start real processes that join a gloo (or stand-in hccl) group on
127.0.0.1 with a free port each; nothing in torch.distributed is mocked. Each area's child scripts
live in its ``scripts/`` folder (``LAUNCH_SCRIPTS``...); helpers shared by several test modules
that are not fixtures are in support.py (test modules never import one another).
"""

from __future__ import annotations

import faulthandler
import importlib.util
import itertools
import json
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

HIDDEN_DEVICES = {"CUDA_VISIBLE_DEVICES": ""}
"""The CPU tier sees no GPU, whatever the host has: on a GPU host its tests (and the processes they
start) run as on a laptop, so what they assert (torch's own answers, device ordinals, which family
detection picks) does not depend on the host. Children on the simulated NPU keep the variable
unset (runtime migration would hand an empty mask on to the NPU's own), and the hardware tier
(tests/test_hardware.py) gives its children the host's devices back with ``child_env(real_devices=True)``."""
HOST_VISIBLE = {name: os.environ.get(name) for name in HIDDEN_DEVICES}
"""The host's own device masks, as pytest started (None: unset, every device visible)."""
os.environ.update(HIDDEN_DEVICES)  # before torch is imported here, and before anything asks CUDA

import torch  # noqa: E402

from npu_migrate import device as _device  # noqa: E402
from npu_migrate.launch.setup.cluster import node_cores  # noqa: E402 - the cores the launcher shares out, as it counts them

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FAKE_NPU = TESTS / "fake_npu"
BROKEN_NPU = TESTS / "broken_npu"
MISMATCHED_NPU = TESTS / "mismatched_npu"
LAUNCH_SCRIPTS = TESTS / "launch" / "scripts"
"""Child scripts of launcher jobs (the launcher's tests, and the top-level ones that run ranks)."""
MIGRATE_SCRIPTS = TESTS / "migrate" / "scripts"
DATA_SCRIPTS = TESTS / "data" / "scripts"

# Variables that would change what the code under test sees; each test starts without them.
_JOB_VARS = (
    "NPU_MIGRATE_DEVICE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "ASCEND_RT_VISIBLE_DEVICES", "FAKE_NPU_DEVICE_COUNT",
    "FAKE_NPU_RELEASE",  # the stand-in simulates the release that pairs with this torch unless a test asks
    "CUDA_VISIBLE_DEVICES",  # set again to hide the host's devices (HIDDEN_DEVICES)
    # npu_migrate.autoload sets it to 0 in the process that asked for a built-in family (an
    # in-process CLI test): the next test in that process must not inherit it.
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
)


def _host_family() -> str:
    """The family detection should pick on this host, by torch's own answers."""
    if importlib.util.find_spec("torch_npu") is not None and hasattr(torch, "npu") and torch.npu.is_available():
        return "npu"
    return "cuda" if torch.cuda.is_available() else "cpu"


HOST_FAMILY = _host_family()
"""What detection finds here: tests of detection compare with it instead of assuming a CPU host."""

TORCH_AUTOLOADS = hasattr(torch, "_import_device_backends")
"""torch >= 2.5 imports every ``torch.backends`` entry point (torch_npu's) at ``import torch``."""


def _fake_npu_missing() -> str | None:
    """The torch features tests/fake_npu is built on that this torch lacks, or None."""
    import torch.utils.backend_registration as registration

    missing = [name for name, present in (
        ("torch._C._acc (PrivateUse1 hooks and device guards written in Python)", hasattr(torch._C, "_acc")),
        ("torch.utils.backend_registration._setup_privateuseone_for_python_backend",
         hasattr(registration, "_setup_privateuseone_for_python_backend")),
    ) if not present]
    return f"the simulated NPU needs {' and '.join(missing)}, which torch {torch.__version__} lacks" if missing else None


FAKE_NPU_MISSING = _fake_npu_missing()


def fake_npu_release_table():  # noqa: ANN201 - the module tests/fake_npu/torch_npu/_release.py
    """The stand-in's release table reader, loaded on its own, once (importing torch_npu would set up the device)."""
    name = "fake_npu_release"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKE_NPU / "torch_npu" / "_release.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


EVERY_TORCH_AREAS = ("launch/", "security/test_store_secret.py", "test_distributed.py")
"""Test paths (under tests/) whose tests carry ``every_torch``: where torch releases differ most for
this project (torch.distributed.elastic's rendezvous and TCPStore's API under the launcher, the
job's signed store, torch.distributed itself). The torch 2.1 tier of .ci/run runs their slow tests
too, beside the fast loop: ``-m "not long and (not slow or every_torch)"``."""

MAIN_COMMAND_AREAS = ("launch/", "migrate/", "ops/", "libs/", "cuda_api/")
"""Test paths (under tests/) whose tests carry ``main_commands``: the project's main commands, the
launcher and runtime migration (with the CUDA libraries' shims and the CUDA table it installs)
with the ``ops`` audit (``launch``, ``launch --migrate``, ``run``, ``ops``), what a user of a new
torch line runs first. The torch 2.7.1 tier of .ci/run (the line of torch-npu 2.7.1, where most
Ascend users are) runs their slow tests beside ``every_torch``'s:
``-m "not long and (not slow or every_torch or main_commands)"``."""


@pytest.hookimpl(tryfirst=True)  # before -m selects: a `long` test must count as `slow` there
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``long`` test is ``slow`` too; the areas in EVERY_TORCH_AREAS are ``every_torch``, those in
    MAIN_COMMAND_AREAS ``main_commands``; skip the simulated-NPU tier, naming the missing torch
    feature, on a torch too old for it."""
    for item in items:
        if item.get_closest_marker("long") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).as_posix().startswith(EVERY_TORCH_AREAS):
            item.add_marker(pytest.mark.every_torch)
        if item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).as_posix().startswith(MAIN_COMMAND_AREAS):
            item.add_marker(pytest.mark.main_commands)
    if FAKE_NPU_MISSING is None:
        return
    skip = pytest.mark.skip(reason=FAKE_NPU_MISSING)
    for item in items:
        if item.get_closest_marker("fake_npu") is not None:
            item.add_marker(skip)


_WEIGHTS = (("long", 8.0), ("slow", 1.0))
"""Rough cost of a test by its mark, relative to a slow one; any other test counts 1/20."""


class HeaviestFirst:
    """Heaviest modules first, each module's tests in file order: ``--dist loadscope`` gives a worker
    whole modules in this order, so the suite does not end with one worker on a long module while
    the others sit idle (longest-first scheduling). Registered by :func:`pytest_configure`."""

    @pytest.hookimpl(trylast=True)  # after -m: only the tests that will run count
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        weight: dict[str, float] = {}
        for item in items:
            cost = next((w for mark, w in _WEIGHTS if item.get_closest_marker(mark) is not None), 0.05)
            module = item.nodeid.split("::")[0]
            weight[module] = weight.get(module, 0.0) + cost
        items.sort(key=lambda item: -weight[item.nodeid.split("::")[0]])  # stable: file order within a module


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: three workers for every two cores.

    Most tests start interpreters that import torch (compute) and then wait on sockets, timeouts
    and other processes; a worker more than the cores fills those waits, while two per core
    starved the launchers' start-up past the tests' hang guards. ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    (pytest-xdist's own variable) overrides it.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, (3 * node_cores() + 1) // 2)


def _cpu_autocast(enable: bool | None = None) -> bool:
    """Whether CPU autocast is on (set it first when ``enable`` is given): torch >= 2.4 takes the
    device type, and warns that the CPU-only functions are deprecated."""
    try:
        if enable is not None:
            torch.set_autocast_enabled("cpu", enable)
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        if enable is not None:
            torch.set_autocast_cpu_enabled(enable)
        return torch.is_autocast_cpu_enabled()


def _torch_modes() -> dict[str, object]:
    """torch's process-wide modes that an in-process test must leave as it found them."""
    from torch.nn.modules import module as nn_module

    return {
        "grad mode": torch.is_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "autocast (cpu)": _cpu_autocast(),
        "default dtype": torch.get_default_dtype(),
        "Tensor.backward": torch.Tensor.backward,
        "global module hooks": sum(len(getattr(nn_module, name, {})) for name in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks")),
    }


_TORCH_MODES = _torch_modes()


@pytest.fixture(autouse=True)
def torch_modes_kept() -> Iterator[None]:
    """Fail the test that leaves torch's modes changed (grad off, autocast on, a patched backward...),
    and put them back: on the test's worker every later in-process test would inherit them and fail
    somewhere unrelated (a probe that recorded nothing because grad mode was off)."""
    yield
    now = _torch_modes()
    changed = {name: (_TORCH_MODES[name], value) for name, value in now.items() if value != _TORCH_MODES[name]}
    if changed:
        torch.set_grad_enabled(bool(_TORCH_MODES["grad mode"]))
        _cpu_autocast(bool(_TORCH_MODES["autocast (cpu)"]))
        torch.set_default_dtype(_TORCH_MODES["default dtype"])  # type: ignore[arg-type]
        torch.Tensor.backward = _TORCH_MODES["Tensor.backward"]  # type: ignore[method-assign]
        pytest.fail("the test left torch's process-wide modes changed (was, now): " + ", ".join(
            f"{name} {before!r} -> {after!r}" for name, (before, after) in changed.items()), pytrace=False)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch):
    """No job variables; the CPU family forced, as the CPU tier runs on any host (GPU, NPU or none).

    Tests of detection itself delete ``NPU_MIGRATE_DEVICE`` again.
    """
    for name in _JOB_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in HIDDEN_DEVICES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NPU_MIGRATE_DEVICE", "cpu")
    _device._clear_caches()
    yield
    _device._clear_caches()


PORT_POOL_START = 10000
"""The lowest port a test's job is given (below it: well-known services)."""
PORT_STEP = 4
"""Ports set aside per draw: a launcher serves --port and --port + 1 (multi-node)."""


def _port_pool() -> range | None:
    """This worker's ports: below the kernel's ephemeral range, a slice per xdist worker.

    A port the OS chose with ``bind(0)`` comes from the ephemeral range, which the kernel keeps
    handing out (to every outgoing connection, to gloo's pairs, to other tests' draws): between
    the draw and the launcher's bind another process can take it ("Address already in use", a
    flake seen with 15 workers). Ports below that range are handed out only on request, and the
    workers' slices never overlap. None where the range leaves no room (then ``bind(0)``).
    """
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    size = (ephemeral_low - PORT_POOL_START) // workers
    if size < 100 * PORT_STEP:
        return None
    # A replacement worker (after a crash) is numbered past the count: it takes the slot it replaces.
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    return range(PORT_POOL_START + index * size, PORT_POOL_START + (index + 1) * size - PORT_STEP, PORT_STEP)


_PORT_POOL = _port_pool()
_port_draws = iter(())


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))  # without SO_REUSEADDR: a port still in TIME_WAIT is skipped too
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port for a test's job, with the next one free too (a launcher's --port + 1).

    Drawn in turn from this worker's slice (:func:`_port_pool`), starting at a random place, so
    no port is drawn twice in a run and no other worker or the kernel hands it out meanwhile.
    """
    global _port_draws
    if _PORT_POOL is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(2):
        for port in _port_draws:
            if _bindable(port) and _bindable(port + 1):
                return port
        start = random.randrange(len(_PORT_POOL))
        _port_draws = itertools.chain(_PORT_POOL[start:], _PORT_POOL[:start])
    raise RuntimeError(f"no free pair of ports in {_PORT_POOL}")


def child_threads() -> int:
    """The intra-op threads a test's child process gets: its worker's share of the cores.

    The suite runs several workers at once (three per two cores, ``pytest_xdist_auto_num_workers``),
    and each may start a launcher whose ranks would each take ``cores // ranks`` threads, as a job
    that has the host to itself should. Side by side on a 16-core host with 14 workers that is
    hundreds of OpenMP threads against 16 cores (here, 8 threads a rank on 2 cores made an MNIST
    job 1.7 times as long as 1 thread), so a child's OMP_NUM_THREADS says how many cores its test
    has. A value the run exports wins; tests of the launcher's own default drop it (``env_drop``).
    """
    exported = os.environ.get("OMP_NUM_THREADS", "")
    if exported.isdigit() and int(exported) > 0:
        return int(exported)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    return max(1, node_cores() // workers)


# The tests' own computations take the same share, so what a test computes here (a reference
# training run) sums in the same order as what its child processes compute: equal to the bit.
torch.set_num_threads(child_threads())


def child_env(*paths: Path, real_devices: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a child process: ours, with ``paths`` first on PYTHONPATH.

    The family is forced as the tier says: ``npu`` with the simulated NPU on the path, else
    ``cpu``. ``NPU_MIGRATE_DEVICE=""`` in ``extra`` leaves the choice to detection. The host's
    accelerators stay hidden (``HIDDEN_DEVICES``) unless ``real_devices`` (the hardware tier).
    """
    env = {k: v for k, v in os.environ.items() if k not in _JOB_VARS}
    if real_devices:
        env.update({name: value for name, value in HOST_VISIBLE.items() if value is not None})
    elif FAKE_NPU not in paths:
        env.update(HIDDEN_DEVICES)
    env["NPU_MIGRATE_DEVICE"] = "npu" if FAKE_NPU in paths else "cpu"
    pythonpath = [str(p) for p in paths] + [str(ROOT)]
    if env.get("PYTHONPATH"):
        pythonpath.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env.setdefault("OMP_NUM_THREADS", str(child_threads()))
    env.update(extra)
    if not env["NPU_MIGRATE_DEVICE"]:
        del env["NPU_MIGRATE_DEVICE"]
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m npu_migrate ARGS`` as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "npu_migrate", *args],
        env=env or child_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


def run_ranks(
    script: Path, nproc: int, out_dir: Path, *paths: Path, timeout: float = 120, **extra: str
) -> list[dict]:
    """Start ``nproc`` processes of ``script`` with torchrun's variables; return their reports.

    Each rank writes ``rank{RANK}.json`` to ``out_dir``. Every process is killed if the job
    does not finish within ``timeout``, so a hang fails the test instead of the suite.
    """
    port = str(free_port())
    procs, logs = [], []
    for rank in range(nproc):
        env = child_env(
            *paths, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port, OUT_DIR=str(out_dir), **extra,
        )
        logs.append(out_dir / f"rank{rank}.log")
        with logs[-1].open("w") as log:
            procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=ROOT,
                                          stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        # Like a launcher: the first rank to fail ends the job, so a failure never becomes a hang.
        while True:
            codes = [p.poll() for p in procs]  # poll every process, not just up to the first live one
            if None not in codes or any(codes) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        hung = [proc.poll() is None for proc in procs]
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    failures = [
        f"rank {rank} {'was still running after %gs: killed' % timeout if hung[rank] else f'exited {proc.returncode}'}:"
        f"\n{log.read_text()}"
        for rank, (proc, log) in enumerate(zip(procs, logs))
        if proc.returncode != 0
    ]
    assert not failures, "\n".join(failures)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


def released_wheel(version: str):
    """A torch-npu release's wheel, cached (``NPU_MIGRATE_RELEASES_DIR``) or installed; never downloaded.

    Under CI (``CI=true``; .ci/run downloads the wheels first) a missing wheel fails the test;
    elsewhere it skips, saying how to get it.
    """
    from npu_migrate import releases

    try:
        return releases.find(version, allow_download=False)
    except releases.ReleaseNotFound as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must have the wheel (.ci/run downloads it): {exc}")
        pytest.skip(str(exc))


# --------------------------------------------------------------------------- S3 on loopback (moto's server)

KEY_ID, SECRET = "AKIATESTKEYID0000001", "s3cret-Value-That-Must-Not-Show"
# Variables that would let the host's own credentials, profiles or proxies leak into a test.
_STORAGE_VARS = [n for n in os.environ if n.startswith(("AWS_", "OSS_", "NPU_MIGRATE_STORAGE", "NPU_MIGRATE_CACHE"))]
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy",
               "ALL_PROXY")


class Server:
    """A moto S3 server on 127.0.0.1 and the moto-api calls the tests use."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"

    def api(self, path: str, data: bytes | None = None) -> bytes:
        request = urllib.request.Request(f"{self.endpoint}/moto-api/{path}", data=data,
                                         method="POST" if data is not None else "GET",
                                         headers={"Content-Type": "text/plain"})  # not a form: moto reads the body
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to loopback
        with opener.open(request, timeout=30) as response:
            return response.read()

    def record(self) -> None:
        """Start recording requests afresh."""
        self.api("recorder/reset-recording", b"")
        self.api("recorder/start-recording", b"")

    def recorded(self) -> list[dict]:
        self.api("recorder/stop-recording", b"")
        return [json.loads(line) for line in self.api("recorder/download-recording").decode().splitlines() if line]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    # moto creates its recorder on import, writing where this says (not into the repository)
    os.environ.setdefault("MOTO_RECORDER_FILEPATH", str(tmp_path_factory.mktemp("moto") / "recording"))
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    yield Server(moto.get_host_and_port()[1])
    moto.stop()


def s3_env(server: Server) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def oss_env(server: Server) -> dict[str, str]:
    """Only OSS_* names; the virtual-hosted host names reach the server as a proxy."""
    proxy = server.endpoint
    return {"OSS_ENDPOINT": f"http://oss-test-1.example.invalid:{server.port}", "OSS_ACCESS_KEY_ID": KEY_ID,
            "OSS_ACCESS_KEY_SECRET": SECRET, "HTTP_PROXY": proxy, "http_proxy": proxy, "NO_PROXY": "", "no_proxy": ""}


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """No credentials, profiles, config files or proxies of the host machine; a fresh client per test.

    Modules that talk to the server use it for every test: ``pytestmark = pytest.mark.usefixtures("isolated")``.
    """
    from npu_migrate.data import storage

    for name in [*_STORAGE_VARS, *_PROXY_VARS]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    # a guard: anything that would go out over https (AWS's default endpoint) meets a closed local port
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    storage._FILESYSTEMS.clear()
    yield
    storage._FILESYSTEMS.clear()


@pytest.fixture
def s3(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    for name, value in s3_env(server).items():
        monkeypatch.setenv(name, value)
    return server


_buckets = iter(range(10**6))


def new_bucket(prefix: str = "bkt", scheme: str = "s3") -> str:
    from npu_migrate.data import storage

    name = f"{prefix}-{next(_buckets)}"
    storage.filesystem(f"{scheme}://{name}").mkdir(name)
    return name


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``NPU_MIGRATE_TEST_TIMES=FILE``, append each test phase's wall time to FILE as it ends.

    A record that survives a suite cut short (pytest's ``--durations`` prints only at the end), for
    finding where the suite's time goes. Columns: seconds, phase, outcome, test, the time it ended
    (Unix seconds), the xdist worker that ran it (what shows the workers' idle time) and, on the
    teardown line, the whole test's CPU seconds (:data:`_CPU_PROPERTY`).
    """
    target = os.environ.get("NPU_MIGRATE_TEST_TIMES")
    if target and not os.environ.get("PYTEST_XDIST_WORKER"):  # xdist's workers hand their reports to the controller
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "-")
        cpu = dict(report.user_properties).get(_CPU_PROPERTY, "") if report.when == "teardown" else ""
        with open(target, "a") as fh:
            fh.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\t{time.time():.1f}"
                     f"\t{worker}\t{cpu}\n")


_CPU_PROPERTY = "cpu_s"
"""The CPU seconds a whole test used (set-up to teardown): its worker's own, plus those of every
process it started and waited for, theirs included (``RUSAGE_CHILDREN``). The seventh column of
``NPU_MIGRATE_TEST_TIMES``, on the teardown line: on 2 cores the suite is CPU-bound, so this, not
the wall time a loaded machine stretches, says what a test costs."""
_CPU_START = pytest.StashKey[float]()


def _cpu_now() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    """Put a test's CPU seconds (:data:`_CPU_PROPERTY`) on its teardown report, when times are recorded."""
    if not os.environ.get("NPU_MIGRATE_TEST_TIMES"):
        return
    if call.when == "teardown" and _CPU_START in item.stash:
        item.user_properties.append((_CPU_PROPERTY, f"{_cpu_now() - item.stash[_CPU_START]:.2f}"))


HANG_BACKSTOP_S = float(os.environ.get("NPU_MIGRATE_TEST_HANG_BACKSTOP_S", "150"))
"""Seconds past a test's own pytest-timeout (300 s, or its ``timeout`` mark) before its worker is ended.

pytest-timeout's signal method fails a hung test from inside, through a Python signal handler. A
test stuck where that handler never runs (C code holding the worker's main thread, or a wait
after the timeout already fired once) would hold its worker for good, and with ``--dist
loadscope`` the modules queued on it: the suite never ends and says nothing. Past this backstop
faulthandler (a C thread) writes every thread's stack to a file and ends the worker; xdist then
reports the test as crashed, starts a new worker for what was queued, and the summary prints the
stacks. ``NPU_MIGRATE_TEST_HANG_BACKSTOP_S`` sets it (the test of the backstop itself does)."""
_HANG_DIR_VAR = "NPU_MIGRATE_TEST_HANG_DIR"
_hang_file = None


def pytest_configure(config: pytest.Config) -> None:
    """Heaviest modules first (:class:`HeaviestFirst`); the controller picks the directory for the
    backstop's stack dumps, and its workers inherit it; the controller's stall guard
    (tests/stall_guard.py) ends a run whose workers stop reporting."""
    config.pluginmanager.register(HeaviestFirst(), "npu_migrate-heaviest-first")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        from stall_guard import StallGuard

        config.pluginmanager.register(StallGuard(config, HANG_BACKSTOP_S), "npu_migrate-stall-guard")
    if not os.environ.get(_HANG_DIR_VAR):
        os.environ[_HANG_DIR_VAR] = tempfile.mkdtemp(prefix="npu_migrate-test-hangs-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(_HANG_DIR_VAR), ignore_errors=True))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Arm the backstop (HANG_BACKSTOP_S) for the whole of one test: set-up, call and teardown; note
    the CPU time it starts at, when times are recorded (:data:`_CPU_PROPERTY`)."""
    global _hang_file
    if os.environ.get("NPU_MIGRATE_TEST_TIMES"):
        item.stash[_CPU_START] = _cpu_now()
    if _hang_file is None:
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _hang_file = open(Path(os.environ[_HANG_DIR_VAR], f"{name}-{os.getpid()}.txt"), "w")  # noqa: SIM115
    mark = item.get_closest_marker("timeout")
    try:
        ini = float(item.config.getini("timeout") or 300)
    except ValueError:  # pytest-timeout not loaded (-p no:timeout): its ini key is unknown
        ini = 300.0
    limit = float(mark.args[0]) if mark and mark.args else ini
    _hang_file.seek(0)
    _hang_file.truncate()
    _hang_file.write(f"{item.nodeid} did not end within {limit + HANG_BACKSTOP_S:g} s; every thread of its worker:\n")
    _hang_file.flush()
    faulthandler.dump_traceback_later(limit + HANG_BACKSTOP_S, exit=True, file=_hang_file)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        _hang_file.seek(0)
        _hang_file.truncate()
        _hang_file.flush()


FAST_LOOP_NOTICE_S = 5.0
"""A test of the fast loop (``-m "not slow"``) that takes this long is named at the end of the run."""


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    """In the fast loop, name the tests that took ``FAST_LOOP_NOTICE_S`` or more: candidates for ``slow``.

    A notice, never a failure (a loaded machine is slow): the loop stays fast only if tests that
    start launchers or ranks are marked, and this is where a new one shows.
    """
    _print_hangs(terminalreporter)
    if "not slow" not in (config.getoption("markexpr", "") or ""):
        return
    seen: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport) and rep.outcome != "skipped":
                seen[rep.nodeid] = seen.get(rep.nodeid, 0.0) + rep.duration
    over = sorted(((t, n) for n, t in seen.items() if t >= FAST_LOOP_NOTICE_S), reverse=True)
    if over:
        terminalreporter.write_sep("-", f"fast-loop tests that took {FAST_LOOP_NOTICE_S:g} s or more (mark them slow "
                                        "unless they are their area's one real-process test)")
        for took, nodeid in over:
            terminalreporter.write_line(f"{took:6.1f} s  {nodeid}")


def _hangs() -> list[str]:
    """The stacks HANG_BACKSTOP_S dumped: each worker it ended left its file with more than the header."""
    folder = Path(os.environ.get(_HANG_DIR_VAR, "/nonexistent"))
    texts = (dump.read_text(errors="replace").strip() for dump in sorted(folder.glob("*.txt")))
    return [text for text in texts if "\n" in text]  # a header alone: a test still running


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that hung once is not run again: xdist hands a crashed worker's module to its new worker."""
    if any(text.startswith(f"{item.nodeid} did not end") for text in _hangs()):
        pytest.fail(f"{item.nodeid} hung and its worker was ended (its stacks are in the summary); not run again",
                    pytrace=False)


def _print_hangs(terminalreporter) -> None:  # noqa: ANN001
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for text in _hangs():
        terminalreporter.write_sep("!", f"hung test: {text.splitlines()[0]}")
        terminalreporter.write_line(text)
