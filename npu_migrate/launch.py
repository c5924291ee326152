"""``python -m npu_migrate.launch``: one process per device, on one node or many, dying as one job.

Usage::

    python -m npu_migrate.launch --device-num 8 train.py --epochs 10
    # two nodes: the same command on each, with its own --node-rank
    python -m npu_migrate.launch --device-num 8 --nnodes 2 --node-rank 0 --addr 10.0.0.1 train.py
    python -m npu_migrate.launch --dry-run --device-num 2 train.py     # print the world, start nothing

    # seed 003's pattern, a function target: fn(local_rank, *args) on every device of this node
    from npu_migrate.launch import spawn
    spawn(train, args=(opt,), nproc=8, nnodes=opt.world_size, node_rank=opt.rank, addr=opt.addr)

Every worker gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT...) plus NODE_RANK and NPU_MIGRATE_DEVICE, has
its device bound, and runs SCRIPT as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]``.

How the job stays whole:

* Workers are started with ``torch.multiprocessing.start_processes`` from a fork server that has
  already imported torch (it starts before this process imports torch), so a worker costs a fork
  instead of an interpreter start and a torch import.
* Each worker leads its own process group, gets SIGKILL when its parent dies (PR_SET_PDEATHSIG)
  and watches the launcher's pid from a thread, so killing the launcher, even with SIGKILL,
  leaves no worker behind.
* The first rank that fails ends the others: the launcher forwards SIGTERM (or the SIGINT/SIGTERM
  it received itself) to every worker's process group and sends SIGKILL after a grace period.
* With several nodes, node 0's launcher serves a small control store on ``port + 1``; launchers
  register their node rank there (a duplicate is refused), wait for each other, publish a failure
  and poll for others' failures twice a second, so a failure on one node ends every node within
  about a second, not at a collective timeout.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import multiprocessing
import multiprocessing.connection
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Sequence

from npu_migrate.errors import NpuMigrateError

DEFAULT_PORT = 29500
"""MASTER_PORT when several nodes are launched and no --port is given (torchrun's default)."""

CONTROL_PORT_OFFSET = 1
"""Node 0's launcher serves its control store on MASTER_PORT + this (multi-node jobs only)."""

STOP_GRACE_S = 5.0
"""Seconds between the signal forwarded to workers and SIGKILL."""

_POLL_S = 0.05
_CONTROL_POLL_S = 0.5
_ERROR_TAIL_LINES = 12
# Imported once by the fork server; every worker forked from it starts with them loaded.
_PRELOAD = ["torch", "torch.distributed", "npu_migrate.device", "npu_migrate.distributed", "npu_migrate.launch"]
_PR_SET_PDEATHSIG = 1

# Workers forked from the fork server re-run this module as __mp_main__ (multiprocessing's way of
# restoring `python -m npu_migrate.launch`); it is already imported there, which is harmless.
warnings.filterwarnings("ignore", message=r"'npu_migrate\.launch' found in sys\.modules", category=RuntimeWarning)


class LaunchError(NpuMigrateError):
    """Bad launcher input or set-up: nothing was started."""


class JobFailed(NpuMigrateError):
    """Raised by :func:`spawn` when the job did not finish cleanly.

    Attributes:
        exit_code: what the command-line launcher would exit with (1 failure, 128+N signal N).
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _say(message: str) -> None:
    print(f"npu-migrate launch: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class LaunchConfig:
    """Everything about one node's share of the job.

    Attributes:
        nproc: processes (devices) on this node.
        nnodes: nodes in the job.
        node_rank: index of this node.
        addr: address of node 0, where rank 0 serves the rendezvous.
        port: MASTER_PORT.
        device: device family of the workers.
        backend: torch.distributed backend of that family.
        log_dir: one ``rank{N}.log`` per rank here instead of the console.
        max_restarts: how often the whole job is started again after a failure.
        join_timeout: seconds to wait for the other nodes' launchers.
        sources: where nnodes, node rank and address came from (flags, Slurm...).
    """

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    addr: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    device: str = "cpu"
    backend: str = "gloo"
    log_dir: str | None = None
    max_restarts: int = 0
    join_timeout: float = 600.0
    sources: str = "defaults"
    omp_threads: int | None = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def rank(self, local_rank: int) -> int:
        """Global rank of a local process: node rank x processes per node + local index."""
        return self.node_rank * self.nproc + local_rank

    def device_of(self, local_rank: int) -> str:
        return "cpu" if self.device == "cpu" else f"{self.device}:{local_rank}"

    def worker_env(self, local_rank: int, restart_count: int = 0) -> dict[str, str]:
        """The variables a worker gets: torchrun's, plus NODE_RANK and NPU_MIGRATE_DEVICE."""
        env = {
            "RANK": str(self.rank(local_rank)),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_RANK": str(self.rank(local_rank)),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.addr,
            "MASTER_PORT": str(self.port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            "TORCHELASTIC_RUN_ID": f"npu_migrate_{self.addr}_{self.port}",
            "NPU_MIGRATE_DEVICE": self.device,
        }
        if self.omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        return env


@dataclass(frozen=True)
class Target:
    """What each worker runs: a script, a module (``-m``) or a function ``fn(local_rank, *args)``."""

    script: str | None = None
    module: str | None = None
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()

    def describe(self) -> str:
        if self.fn is not None:
            return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}(local_rank, ...)"
        head = ["-m", self.module] if self.module else [self.script or ""]
        return " ".join(shlex.quote(str(a)) for a in [*head, *self.args])


def _slurm_first_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``gpu[07-09,12],cpu1`` -> ``gpu07``."""
    first = ""
    depth = 0
    for char in nodelist:
        if char == "," and depth == 0:
            break
        depth += (char == "[") - (char == "]")
        first += char
    if "[" not in first:
        return first
    prefix, _, rest = first.partition("[")
    return prefix + rest.rstrip("]").split(",")[0].split("-")[0]


def _cluster_defaults(environ: dict[str, str]) -> tuple[dict[str, Any], str]:
    """nnodes, node rank, address and port from Slurm or a Kubeflow/torchrun-style environment."""
    if environ.get("SLURM_JOB_ID") and environ.get("SLURM_NNODES") and environ.get("SLURM_NODEID"):
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
        values: dict[str, Any] = {"nnodes": int(environ["SLURM_NNODES"]), "node_rank": int(environ["SLURM_NODEID"])}
        if nodelist:
            values["addr"] = _slurm_first_host(nodelist)
        return values, "Slurm (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST)"
    if environ.get("PET_NNODES") or environ.get("PET_NODE_RANK") or environ.get("PET_MASTER_ADDR"):
        values = {}
        if environ.get("PET_NNODES"):
            values["nnodes"] = int(environ["PET_NNODES"].split(":")[-1])
        if environ.get("PET_NODE_RANK"):
            values["node_rank"] = int(environ["PET_NODE_RANK"])
        if environ.get("PET_MASTER_ADDR"):
            values["addr"] = environ["PET_MASTER_ADDR"]
        if environ.get("PET_MASTER_PORT"):
            values["port"] = int(environ["PET_MASTER_PORT"])
        return values, "Kubeflow/torchrun environment (PET_*)"
    if environ.get("MASTER_ADDR") and environ.get("NNODES") and (environ.get("NODE_RANK") or environ.get("GROUP_RANK")):
        values = {
            "nnodes": int(environ["NNODES"]),
            "node_rank": int(environ.get("NODE_RANK") or environ["GROUP_RANK"]),
            "addr": environ["MASTER_ADDR"],
        }
        if environ.get("MASTER_PORT"):
            values["port"] = int(environ["MASTER_PORT"])
        return values, "environment (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT)"
    return {}, "defaults"


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _plain_settings(
    nproc: int | None,
    nnodes: int | None,
    node_rank: int | None,
    addr: str | None,
    port: int | None,
    max_restarts: int,
    environ: dict[str, str],
) -> dict[str, Any]:
    """The checks that need no torch, so bad input is refused before anything heavy starts."""
    given = {"nnodes": nnodes, "node_rank": node_rank, "addr": addr, "port": port}
    try:
        found, source = _cluster_defaults(environ)
    except ValueError as exc:
        raise LaunchError(f"could not read the cluster environment: {exc}. Pass --nnodes, --node-rank and --addr.") from None
    from_env = [k for k in found if given.get(k) is None]
    values = {k: (v if v is not None else found.get(k)) for k, v in given.items()}
    sources = ", ".join(
        part for part in (
            "flags" if any(v is not None for v in given.values()) else "",
            f"{source}: {', '.join(from_env)}" if from_env else "",
        ) if part
    ) or "defaults"
    nnodes = 1 if values["nnodes"] is None else int(values["nnodes"])
    node_rank = 0 if values["node_rank"] is None else int(values["node_rank"])
    addr = "127.0.0.1" if values["addr"] is None else str(values["addr"])

    if nnodes < 1:
        raise LaunchError(f"--nnodes {nnodes} is not positive: expected the number of nodes, 1 or more.")
    if not 0 <= node_rank < nnodes:
        raise LaunchError(
            f"--node-rank {node_rank} is outside [0, {nnodes}) for --nnodes {nnodes}: "
            "give each node a different rank from 0 to nnodes-1."
        )
    if nproc is not None and nproc < 1:
        raise LaunchError(f"--device-num {nproc} is not positive: expected 1 or more processes per node.")
    if max_restarts < 0:
        raise LaunchError(f"--max-restarts {max_restarts} is negative: expected 0 or more.")
    try:
        socket.getaddrinfo(addr, None)
    except (socket.gaierror, UnicodeError) as exc:
        raise LaunchError(
            f"--addr {addr!r} does not resolve ({exc.args[-1] if exc.args else exc}). Pass node 0's IP "
            "address or a host name every node can resolve."
        ) from None
    if values["port"] is None:
        port = _free_port() if nnodes == 1 else DEFAULT_PORT
    else:
        port = int(values["port"])
        last = 65535 - (CONTROL_PORT_OFFSET if nnodes > 1 else 0)
        if not 1 <= port <= last:
            raise LaunchError(f"--port {port} is outside 1-{last}: pick a free TCP port.")
        if node_rank == 0:
            wanted = [port] if nnodes == 1 else [port, port + CONTROL_PORT_OFFSET]
            busy = [p for p in wanted if not _port_is_free(p)]
            if busy:
                raise LaunchError(
                    f"port {busy[0]} is in use on this host: pick another --port"
                    + (" or leave it out to get a free one." if nnodes == 1 else
                       f" (the same on every node; the launcher also uses --port + {CONTROL_PORT_OFFSET}).")
                )
    return {"nnodes": nnodes, "node_rank": node_rank, "addr": addr, "port": port, "sources": sources}


def make_config(
    nproc: int | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    addr: str | None = None,
    port: int | None = None,
    device: str | None = None,
    log_dir: str | None = None,
    max_restarts: int = 0,
    join_timeout: float = 600.0,
    environ: dict[str, str] | None = None,
    before_device: Callable[[], Any] | None = None,
) -> LaunchConfig:
    """Check the launcher's input and fill in what is missing; start nothing.

    Flags win; then Slurm or a Kubeflow/torchrun-style environment; then single-node defaults.

    Args:
        before_device: called after the checks that need no torch and before the device
            family is resolved (the launcher starts its fork server there).

    Raises:
        LaunchError: any input that cannot work, as one line.
        UnknownDeviceError, DeviceUnavailableError: from the device layer.
    """
    environ = dict(os.environ if environ is None else environ)
    plain = _plain_settings(nproc, nnodes, node_rank, addr, port, max_restarts, environ)
    if before_device is not None:
        before_device()
    from npu_migrate import device as _device

    spec = _device.device_spec(device)
    count = _device.device_count()
    if nproc is None:
        nproc = count
    if spec.is_accelerator and nproc > count:
        mask = environ.get(spec.visible_devices_env or "")
        seen = f" ({spec.visible_devices_env}={mask!r})" if mask is not None else ""
        raise LaunchError(
            f"--device-num {nproc} is more than the {count} {spec.name} device(s) visible here{seen}. "
            f"Use --device-num {count} or fewer."
        )
    omp = None
    if "OMP_NUM_THREADS" not in environ and nproc > 1:
        omp = max(1, (os.cpu_count() or 1) // nproc)  # torchrun sets 1; share the cores instead
    return LaunchConfig(
        nproc=nproc, device=spec.name, backend=_device.default_backend(spec), log_dir=log_dir,
        max_restarts=max_restarts, join_timeout=join_timeout, omp_threads=omp, **plain,
    )


def world_table(cfg: LaunchConfig, target: Target) -> str:
    """The ``--dry-run`` text: every process of this node, its ranks, device, backend and variables."""
    lines = [
        f"world: {cfg.nnodes} node(s) x {cfg.nproc} process(es) = {cfg.world_size} rank(s) on "
        f"{cfg.device} with {cfg.backend}; master {cfg.addr}:{cfg.port}; settings from {cfg.sources}",
        f"target: {target.describe()}",
        "",
        f"{'node':>4}  {'local_rank':>10}  {'rank':>4}  {'device':<8}  backend",
    ]
    for local in range(cfg.nproc):
        lines.append(f"{cfg.node_rank:>4}  {local:>10}  {cfg.rank(local):>4}  {cfg.device_of(local):<8}  {cfg.backend}")
    lines.append("")
    for local in range(cfg.nproc):
        env = " ".join(f"{k}={v}" for k, v in cfg.worker_env(local).items())
        lines.append(f"rank {cfg.rank(local)}: {env}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the worker side


def _in_fork_server() -> bool:
    """True while multiprocessing's fork server imports this module as a preload."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_code.co_filename.endswith("forkserver.py"):
            return True
        frame = frame.f_back
    return False


def _kill_worker_groups() -> None:
    """Fork server exit: SIGKILL the process group of every worker it forked.

    The fork server exits when the launcher does, even by SIGKILL (its pipe to the launcher
    closes). PR_SET_PDEATHSIG then kills each worker, but not what a worker started; each
    worker leads its own process group, so killing the groups here takes those too.
    """
    children: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as fh:
                children.update(int(pid) for pid in fh.read().split())
        except OSError:
            continue
    for pid in children:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


if sys.platform.startswith("linux") and _in_fork_server():
    import atexit

    atexit.register(_kill_worker_groups)



def _die_with_launcher(launcher_pid: int) -> None:
    """Make sure this worker, and what it started, cannot outlive the launcher."""
    try:
        os.setpgid(0, 0)  # our own group: the launcher can signal us and our children at once
    except OSError:
        pass
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(launcher_pid, 0)
                gone = os.getppid() != parent
            except ProcessLookupError:
                gone = True
            except PermissionError:
                gone = False
            if gone:
                try:
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                finally:
                    os._exit(137)

    threading.Thread(target=watch, name="npu_migrate-launcher-watch", daemon=True).start()


def _redirect_output(path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
        except (AttributeError, ValueError):
            pass


def _run_target(local_rank: int, target: Target) -> None:
    import runpy

    if target.fn is not None:
        target.fn(local_rank, *target.args)
    elif target.module is not None:
        sys.argv = [target.module, *map(str, target.args)]
        sys.path.insert(0, os.getcwd())  # as `python -m` does
        runpy.run_module(target.module, run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(str(target.script))
        sys.argv = [str(target.script), *map(str, target.args)]
        sys.path.insert(0, os.path.dirname(script))  # as `python script.py` does
        runpy.run_path(script, run_name="__main__")


def _user_frames(tb: Any) -> Any:
    """Skip the launcher's and runpy's frames at the top of a worker's traceback."""
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__ or "runpy" in tb.tb_frame.f_code.co_filename
    ):
        tb = tb.tb_next
    return tb


def _worker(local_rank: int, cfg: LaunchConfig, target: Target, restart: int, launcher_pid: int, error_dir: str) -> None:
    """Entry point of every worker process (runs in the child)."""
    _die_with_launcher(launcher_pid)
    os.environ.update(cfg.worker_env(local_rank, restart))
    rank = cfg.rank(local_rank)
    if cfg.log_dir:
        _redirect_output(os.path.join(cfg.log_dir, f"rank{rank}.log"))
    try:
        from npu_migrate import device as _device

        _device._clear_caches()  # the fork server may have detected with another environment
        if _device.device_spec().is_accelerator:
            _device.set_device(local_rank)  # bound before any user code runs
        _run_target(local_rank, target)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # stopped by the launcher: no traceback
    except BaseException as exc:  # noqa: BLE001 - report anything, then exit 1 like Python
        record = {
            "rank": rank,
            "local_rank": local_rank,
            "node_rank": cfg.node_rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.time(),
            "type": type(exc).__name__,
            "message": " ".join(str(exc).split())[:500],
            "traceback": "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__))),
        }
        tmp = os.path.join(error_dir, f".rank{rank}.json.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        os.replace(tmp, os.path.join(error_dir, f"rank{rank}.json"))
        if cfg.log_dir:  # on the console the launcher's summary shows it once, not once per rank
            sys.stderr.write(record["traceback"])
        raise SystemExit(1) from None


# --------------------------------------------------------------------------- the launcher side


@dataclass
class _Failure:
    """Why the job is ending, as every launcher reports it."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    exit_code: int | None = None
    signal_name: str | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    log: str | None = None
    time: float = field(default_factory=time.time)

    def headline(self) -> str:
        who = f"rank {self.rank} (local rank {self.local_rank} on node {self.node_rank}, host {self.host})"
        if self.exc_type is not None:
            return f"{who} failed: {self.exc_type}: {self.message}"
        if self.signal_name is not None:
            hint = ""
            if self.signal_name == "SIGKILL":
                hint = (" (often the kernel's out-of-memory killer: check `dmesg` or `journalctl -k`, "
                        "then lower the batch size or --device-num)")
            elif self.signal_name == "SIGSEGV":
                hint = " (a crash in native code: a driver, CANN/CUDA or an extension)"
            return f"{who} was killed by {self.signal_name}{hint}"
        return f"{who} exited with code {self.exit_code} without a Python traceback"

    def details(self) -> list[str]:
        lines = []
        if self.traceback:
            tail = self.traceback.rstrip().splitlines()[-_ERROR_TAIL_LINES:]
            lines += ["traceback (last lines):"] + [f"  {line}" for line in tail]
        if self.log:
            lines.append(f"full output: {self.log}")
        return lines


class _LostContact(Exception):
    pass


class _Control:
    """The launchers' shared store on node 0 (multi-node jobs only)."""

    def __init__(self, cfg: LaunchConfig) -> None:
        from torch.distributed import TCPStore

        self.cfg = cfg
        self.port = cfg.port + CONTROL_PORT_OFFSET
        timeout = timedelta(seconds=max(cfg.join_timeout, 1.0))
        try:
            if cfg.node_rank == 0:
                self.store = TCPStore("0.0.0.0", self.port, None, True, timeout, wait_for_workers=False)
            else:
                self.store = TCPStore(cfg.addr, self.port, None, False, timeout)
        except Exception as exc:  # noqa: BLE001 - TCPStore raises RuntimeError or DistNetworkError
            if cfg.node_rank == 0:
                raise LaunchError(
                    f"cannot serve the launcher store on port {self.port} ({' '.join(str(exc).split())[:160]}): "
                    "is another launcher with --node-rank 0 running? Pick another --port on every node."
                ) from None
            raise LaunchError(
                f"could not reach node 0's launcher at {cfg.addr}:{self.port} within {cfg.join_timeout:g} s: "
                "start the launcher with --node-rank 0 on that host, with the same --port."
            ) from None
        self.store.set_timeout(timedelta(seconds=30))

    def join(self) -> None:
        cfg, store = self.cfg, self.store
        shape = json.dumps({"nnodes": cfg.nnodes, "device_num": cfg.nproc}, sort_keys=True)
        agreed = store.compare_set("job/shape", "", shape).decode()
        if agreed != shape:
            theirs = json.loads(agreed)
            raise LaunchError(
                f"this launcher has --nnodes {cfg.nnodes} --device-num {cfg.nproc} but the job was started "
                f"with --nnodes {theirs['nnodes']} --device-num {theirs['device_num']}: use the same values on every node."
            )
        if store.add(f"node/{cfg.node_rank}", 1) > 1:
            host = store.get(f"node/{cfg.node_rank}/host").decode() if store.check([f"node/{cfg.node_rank}/host"]) else "?"
            raise LaunchError(
                f"node rank {cfg.node_rank} is already taken by the launcher on host {host}: give every node "
                f"a different --node-rank in [0, {cfg.nnodes})."
            )
        store.set(f"node/{cfg.node_rank}/host", socket.gethostname())
        self.barrier("joined", "joined the job")

    def barrier(self, key: str, what: str, stop: Callable[[], bool] = lambda: False) -> None:
        store, cfg = self.store, self.cfg
        store.add(key, 1)
        deadline = time.monotonic() + cfg.join_timeout
        while store.add(key, 0) < cfg.nnodes:
            if stop():
                return
            if time.monotonic() > deadline:
                missing = [str(i) for i in range(cfg.nnodes) if not store.check([f"node/{i}"])]
                raise LaunchError(
                    f"only {store.add(key, 0)} of {cfg.nnodes} nodes {what} within {cfg.join_timeout:g} s"
                    + (f" (missing node ranks: {', '.join(missing)})" if missing else "")
                    + f": start the launcher on every node with --addr {cfg.addr} --port {cfg.port}."
                )
            time.sleep(0.05)

    def _op(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - the store is gone or unreachable
            raise _LostContact(str(exc)) from None

    def publish_failure(self, attempt: int, failure: _Failure) -> None:
        payload = json.dumps(failure.__dict__)
        try:
            self.store.compare_set(f"attempt{attempt}/failed", "", payload)  # the first failure wins
        except Exception:  # noqa: BLE001 - nobody left to tell
            pass

    def failure(self, attempt: int) -> _Failure | None:
        key = f"attempt{attempt}/failed"
        if not self._op(lambda: self.store.check([key])):
            return None
        return _Failure(**json.loads(self._op(lambda: self.store.get(key))))

    def finish(self, attempt: int, stop: Callable[[], bool]) -> _Failure | None:
        """Wait until every node's workers are done; return a failure seen meanwhile."""
        done = f"attempt{attempt}/done"
        self._op(lambda: self.store.add(done, 1))
        while self._op(lambda: self.store.add(done, 0)) < self.cfg.nnodes:
            failure = self.failure(attempt)
            if failure is not None or stop():
                return failure
            time.sleep(0.1)
        acked = f"attempt{attempt}/acked"
        self._op(lambda: self.store.add(acked, 1))
        if self.cfg.node_rank == 0:  # keep serving until every node has read the result
            deadline = time.monotonic() + 10
            while self.store.add(acked, 0) < self.cfg.nnodes and time.monotonic() < deadline:
                time.sleep(0.05)
        return None


class _Signals:
    """Turns SIGINT/SIGTERM into a flag the watch loop reads, and restores the handlers after."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.count = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = self.received or signum
        self.count += 1

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _start_fork_server() -> str:
    """Start the fork server that preloads torch, before this process imports it; return the method."""
    method = os.environ.get("NPU_MIGRATE_START_METHOD", "forkserver")
    if method == "forkserver" and "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        forkserver.set_forkserver_preload(_PRELOAD)
        forkserver.ensure_running()
        return "forkserver"
    return "spawn"


def _stop_fork_server() -> None:
    """End the fork server at once: nothing more will be launched from it.

    It holds this process's stdout and stderr (while it imports torch, or winds down); a caller
    reading them (a pipe, `| tee`, a test) would otherwise wait seconds for it.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        # Let multiprocessing start a fresh one if this process launches again.
        for attr, value in (("_forkserver_pid", None), ("_forkserver_address", None)):
            if hasattr(server, attr):
                setattr(server, attr, value)
        alive = getattr(server, "_forkserver_alive_fd", None)
        if alive is not None:
            try:
                os.close(alive)
            except OSError:
                pass
            server._forkserver_alive_fd = None


class _Job:
    def __init__(self, cfg: LaunchConfig, target: Target, start_method: str) -> None:
        self.cfg = cfg
        self.target = target
        self.start_method = start_method
        self.signals = _Signals()
        self.control: _Control | None = None
        self.error_dir = tempfile.mkdtemp(prefix="npu_migrate_launch_")

    # -- process handling

    def _start(self, attempt: int) -> list[Any]:
        import torch.multiprocessing as mp

        for name in os.listdir(self.error_dir):
            os.unlink(os.path.join(self.error_dir, name))
        context = mp.start_processes(
            _worker,
            args=(self.cfg, self.target, attempt, os.getpid(), self.error_dir),
            nprocs=self.cfg.nproc,
            join=False,
            start_method=self.start_method,
        )
        # Keep the context: on torch 2.1 it owns the workers' error queues, whose semaphores are
        # unlinked when it is garbage-collected, and a worker still unpickling its arguments then
        # fails with FileNotFoundError in SemLock._rebuild.
        self._context = context
        return list(context.processes)

    def _stop(self, procs: list[Any], sig: int = signal.SIGTERM) -> None:
        """Signal every live worker's group, then SIGKILL what is left after the grace period."""
        def send(s: int) -> None:
            for proc in procs:
                if proc.exitcode is None and proc.pid:
                    try:
                        os.killpg(proc.pid, s)
                    except OSError:
                        try:
                            os.kill(proc.pid, s)
                        except OSError:
                            pass

        send(sig)
        deadline = time.monotonic() + STOP_GRACE_S
        seen = self.signals.count
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            if self.signals.count > seen + (1 if sig == self.signals.received else 0):
                break  # asked again: stop waiting
            multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=_POLL_S)
        send(signal.SIGKILL)
        for proc in procs:
            proc.join()
            # A worker leaves its group behind only if something it started is still there.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def _failure_of(self, local: int, proc: Any) -> _Failure:
        rank = self.cfg.rank(local)
        log = os.path.join(self.cfg.log_dir, f"rank{rank}.log") if self.cfg.log_dir else None
        path = os.path.join(self.error_dir, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
            return _Failure(rank, local, self.cfg.node_rank, rec["host"], exit_code=proc.exitcode,
                            exc_type=rec["type"], message=rec["message"], traceback=rec["traceback"],
                            log=log, time=rec["time"])
        code = proc.exitcode
        signal_name = None
        if code is not None and code < 0:
            try:
                signal_name = signal.Signals(-code).name
            except ValueError:
                signal_name = f"signal {-code}"
        return _Failure(rank, local, self.cfg.node_rank, socket.gethostname(), exit_code=code,
                        signal_name=signal_name, log=log)

    def _watch(self, procs: list[Any], attempt: int) -> tuple[str, _Failure | None]:
        """Wait for the workers; return ("ok"|"failed"|"remote"|"signal"|"lost", failure)."""
        next_poll = time.monotonic() + _CONTROL_POLL_S
        while True:
            if self.signals.received is not None:
                return "signal", None
            live = [p.sentinel for p in procs if p.exitcode is None]
            if live:
                multiprocessing.connection.wait(live, timeout=_POLL_S)
            failed = [(i, p) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                # The root cause is the earliest Python failure; ranks that died of its broken
                # collectives come later. Without tracebacks, the lowest rank.
                candidates = [self._failure_of(i, p) for i, p in failed]
                candidates.sort(key=lambda f: (f.exc_type is None, f.time if f.exc_type else 0, f.rank))
                return "failed", candidates[0]
            if all(p.exitcode == 0 for p in procs):
                return "ok", None
            if self.control is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + _CONTROL_POLL_S
                try:
                    remote = self.control.failure(attempt)
                except _LostContact:
                    return "lost", None
                if remote is not None:
                    return "remote", remote

    # -- the job

    def run(self) -> int:
        cfg = self.cfg
        with self.signals:
            try:
                if cfg.nnodes > 1:
                    self.control = _Control(cfg)
                    self.control.join()
                if cfg.log_dir:
                    os.makedirs(cfg.log_dir, exist_ok=True)
                return self._attempts()
            finally:
                for name in os.listdir(self.error_dir):
                    os.unlink(os.path.join(self.error_dir, name))
                os.rmdir(self.error_dir)

    def _attempts(self) -> int:
        cfg = self.cfg
        attempt = 0
        while True:
            procs = self._start(attempt)
            outcome, failure = self._watch(procs, attempt)
            if outcome == "ok" and self.control is not None:
                try:
                    failure = self.control.finish(attempt, lambda: self.signals.received is not None)
                except _LostContact:
                    outcome = "lost"
                else:
                    outcome = "remote" if failure is not None else outcome
                    if self.signals.received is not None:
                        outcome = "signal"
            if outcome == "ok":
                return 0
            if outcome == "signal":
                sig = self.signals.received or signal.SIGTERM
                name = signal.Signals(sig).name
                _say(f"received {name}: stopping {sum(p.exitcode is None for p in procs)} running rank(s) on node {cfg.node_rank}.")
                if self.control is not None:
                    self.control.publish_failure(attempt, _Failure(
                        -1, -1, cfg.node_rank, socket.gethostname(), signal_name=name,
                        message=f"the launcher of node {cfg.node_rank} received {name}"))
                self._stop(procs, sig)
                return 128 + sig
            if outcome == "lost":
                self._stop(procs)
                _say(f"lost contact with node 0's launcher at {cfg.addr}:{cfg.port + CONTROL_PORT_OFFSET}: "
                     f"stopped this node's ranks. Check node 0's output for the cause.")
                return 1
            assert failure is not None
            if outcome == "failed" and self.control is not None:
                self.control.publish_failure(attempt, failure)
            running = sum(p.exitcode is None for p in procs)
            self._stop(procs)
            if failure.rank < 0:  # another node's launcher was interrupted
                _say(f"ending: {failure.message}; stopped {running} rank(s) on node {cfg.node_rank}.")
                return 1
            where = "" if outcome == "failed" else f" on node {failure.node_rank}"
            _say(failure.headline() + where)
            for line in failure.details():
                print(f"  {line}", file=sys.stderr)
            if attempt < cfg.max_restarts:
                attempt += 1
                _say(f"restarting the job (restart {attempt} of {cfg.max_restarts}).")
                if self.control is not None:
                    try:
                        self.control.barrier(f"attempt{attempt}/ready", "were ready to restart")
                    except _LostContact:
                        _say("lost contact with node 0's launcher while restarting.")
                        return 1
                continue
            _say(f"job failed: stopped {running} other rank(s) on node {cfg.node_rank}; exit code 1.")
            return 1


def _run(cfg: LaunchConfig, target: Target, start_method: str) -> int:
    try:
        return _Job(cfg, target, start_method).run()
    finally:
        # Every worker has been reaped. The fork server would otherwise hold our stdout and stderr
        # while its own interpreter winds down (a second or more with torch loaded), and a
        # reader of our output (`| tee`, a CI log) would wait for it. Another launch in this
        # process starts a new one.
        _stop_fork_server()


def spawn(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    nproc: int | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    addr: str | None = None,
    port: int | None = None,
    device: str | None = None,
    log_dir: str | None = None,
    max_restarts: int = 0,
    join_timeout: float = 600.0,
) -> None:
    """Run ``fn(local_rank, *args)`` in one process per device of this node, as seed 003 does.

    Every process gets torchrun's variables for its global rank (node rank x nproc + local rank),
    so ``fn`` can call :func:`npu_migrate.init_distributed`. ``fn`` must be importable by name
    (defined at module level) for the worker processes to find it.

    Raises:
        LaunchError: bad input; nothing was started.
        JobFailed: a rank failed (its rank, host and error are in the message) or the launcher
            was interrupted.
    """
    methods: list[str] = []
    try:
        cfg = make_config(nproc, nnodes, node_rank, addr, port, device, log_dir, max_restarts, join_timeout,
                          before_device=lambda: methods.append(_start_fork_server()))
    except NpuMigrateError:
        _stop_fork_server()
        raise
    code = _run(cfg, Target(fn=fn, args=tuple(args)), methods[0])
    if code != 0:
        raise JobFailed(f"the job ended with exit code {code}; see the messages above.", code)


# --------------------------------------------------------------------------- command line


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong and where to look)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's flags; shared by ``python -m npu_migrate.launch`` and ``npu-migrate launch``."""
    parser.add_argument("--device-num", "--device_num", "--nproc-per-node", "--nproc_per_node", dest="nproc",
                        type=int, default=None,
                        help="Processes on this node, one per device (default: the devices of the family; 1 on CPU).")
    parser.add_argument("--nnodes", "--world-size", "--world_size", dest="nnodes", type=int, default=None,
                        help="Number of nodes (seed 003 calls it --world-size) (default: 1, or from Slurm/Kubeflow).")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=None,
                        help="Index of this node in [0, nnodes) (default: 0, or from Slurm/Kubeflow).")
    parser.add_argument("--addr", "--master-addr", "--master_addr", dest="addr", default=None,
                        help="Address of node 0 (default: 127.0.0.1, or from Slurm/Kubeflow).")
    parser.add_argument("--port", "--master-port", "--master_port", dest="port", type=int, default=None,
                        help=f"MASTER_PORT (default: a free port on one node, {DEFAULT_PORT} on several; "
                             f"multi-node launchers also use port + {CONTROL_PORT_OFFSET}).")
    parser.add_argument("--device", default=None,
                        help="Device family: auto, npu, cuda or cpu (default: NPU_MIGRATE_DEVICE, else detected).")
    parser.add_argument("--log-dir", "--log_dir", dest="log_dir", default=None,
                        help="Write each rank's output to DIR/rank{N}.log instead of the console.")
    parser.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0,
                        help="Restart the whole job this many times after a failure (default: %(default)s).")
    parser.add_argument("--join-timeout", dest="join_timeout", type=float, default=600.0,
                        help="Seconds to wait for the other nodes' launchers (default: %(default)s).")
    parser.add_argument("--migrate", action="store_true",
                        help="Runtime migration: the script's CUDA calls go to the chosen device (npu, or cpu for tests).")
    parser.add_argument("--migrate-report", dest="migrate_report", default=None,
                        help="With --migrate, merge what every rank redirected into FILE (.json or markdown).")
    parser.add_argument("--dry-run", action="store_true",
                        help="Print every process's ranks, device, backend and environment; start nothing.")
    parser.add_argument("-m", "--module", action="store_true",
                        help="Run SCRIPT as a module, like python -m.")
    from npu_migrate.compare import settings as probe_settings  # --probe DIR and its filters

    probe_settings.add_probe_arguments(parser)
    parser.add_argument("script", metavar="SCRIPT", help="The training script (or module with -m).")
    parser.add_argument("script_args", metavar="ARGS", nargs=argparse.REMAINDER,
                        help="Arguments for the script, passed through untouched.")


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``launch`` to ``subparsers`` (or make the stand-alone parser)."""
    description = "Start one process per device on this node; all of them end when one fails."
    if subparsers is None:
        parser = _OneLineParser(prog="python -m npu_migrate.launch", description=description)
    else:
        parser = subparsers.add_parser("launch", help="Run a training script on every device.",
                                       description=description)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Validate, then launch (or print the world with --dry-run)."""
    if args.module:
        if importlib.util.find_spec(args.script.split(".")[0]) is None:
            raise LaunchError(f"module {args.script!r} not found: check the name and that it is importable from here.")
        target = Target(module=args.script, args=tuple(args.script_args))
    else:
        if not os.path.isfile(args.script):
            raise LaunchError(f"script {args.script!r} not found (working directory {os.getcwd()}).")
        target = Target(script=args.script, args=tuple(args.script_args))
    if args.migrate_report and not args.migrate:
        raise LaunchError("--migrate-report needs --migrate: it reports what runtime migration redirected.")
    from npu_migrate.compare import settings as probe_settings

    probe = probe_settings.from_args(args)
    if probe is not None and not args.dry_run:
        # Before the fork server starts: it imports torch, and the probe must be armed there.
        probe.prepare_directory(args.nproc * (args.nnodes or 1) if args.nproc else None)
        probe.export()
    report_dir = None
    if args.migrate and not args.dry_run:
        # Before the fork server starts: it imports torch, and the migration must be armed there.
        from npu_migrate import _migrate_hook

        report_dir = tempfile.mkdtemp(prefix="npu_migrate_report_") if args.migrate_report else None
        _migrate_hook.export_environment(args.device, args.nproc or 1, report_dir)
    methods: list[str] = []
    try:
        cfg = make_config(args.nproc, args.nnodes, args.node_rank, args.addr, args.port, args.device,
                          args.log_dir, args.max_restarts, args.join_timeout,
                          before_device=None if args.dry_run else lambda: methods.append(_start_fork_server()))
    except NpuMigrateError:
        _stop_fork_server()
        raise
    if args.dry_run:
        print(world_table(cfg, target))
        return 0
    migrating = f", CUDA calls migrated to {cfg.device}" if args.migrate else ""
    _say(f"node {cfg.node_rank} of {cfg.nnodes}: {cfg.nproc} process(es) on {cfg.device} with {cfg.backend}, "
         f"master {cfg.addr}:{cfg.port} (settings from {cfg.sources}){migrating}")
    try:
        return probe_settings.finish_job(probe, _run(cfg, target, methods[0]))
    except NpuMigrateError:
        _stop_fork_server()
        raise
    finally:
        if report_dir:
            from npu_migrate.migrate.cli import write_report

            _say(write_report(report_dir, args.migrate_report))
            shutil.rmtree(report_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m npu_migrate.launch``."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except NpuMigrateError as exc:
        _say(f"error: {exc}")
        return 2 if type(exc).__name__ == "UnknownDeviceError" else 1


if __name__ == "__main__":
    # Run the imported module's main, so workers unpickle npu_migrate.launch._worker rather than
    # a function of __main__.
    from npu_migrate.launch import main as _main

    _code = _main()
    # The job is over and every worker reaped. Tearing down an interpreter that holds torch takes
    # about a second; nothing in it is left to finalize, so flush and leave.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
