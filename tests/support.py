"""Helpers shared by test modules (which never import one another): plain functions, classes and marks.

Fixtures live in conftest.py. Sections: launchers as real processes and files to wait on, multi-node
launchers and their stack dumps, hosts as network namespaces, torch features a test needs, migration's
patched attributes, the examples' runs and metrics, and compare's recordings written by hand.
Waits poll for a file or a line with a generous deadline (a hang guard, not a timing assertion).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import LAUNCH_SCRIPTS, ROOT, child_env
from npu_migrate.compare import records

JOB = LAUNCH_SCRIPTS / "launch_job.py"
HANG_GUARD_S = 240.0
"""How long a wait may take before the test fails as hung (the machine may be slow and shared)."""


class Launch:
    """One `python -m npu_migrate.launch ...` process, as a user would start it (optionally in a netns)."""

    def __init__(self, tmp: Path, *args: str, name: str = "launch", paths: tuple = (), netns: str | None = None,
                 env_drop: tuple[str, ...] = (), sigint_ignored: bool = False, python: str = sys.executable,
                 **env: str) -> None:
        self.out = tmp
        self.name = name
        self.stdout = tmp / f"{name}.out"
        self.stderr = tmp / f"{name}.err"
        environ = child_env(*paths, OUT_DIR=str(tmp), **env)
        for key in env_drop:
            environ.pop(key, None)
        prefix = ["ip", "netns", "exec", netns] if netns else []
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                [*prefix, python, "-m", "npu_migrate.launch", *args],
                env=environ, cwd=ROOT, stdout=out, stderr=err,
                # As a background job of a non-interactive shell (`cmd &` in a script) starts it.
                preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
            )

    def wait(self, timeout: float = HANG_GUARD_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"launcher {self.name} did not end within {timeout} s:\n{self.err}") from None

    @property
    def err(self) -> str:
        return self.stderr.read_text()

    @property
    def outtext(self) -> str:
        return self.stdout.read_text()


def wait_all(nodes: list[Launch]) -> list[int]:
    """Every launcher's exit code; on a launcher that does not end, every launcher's output."""
    codes = []
    for n in nodes:
        try:
            codes.append(n.wait())
        except AssertionError:
            for other in nodes:
                other.proc.kill()
            raise AssertionError("\n".join(f"{o.name}:\n{o.err}" for o in nodes)) from None
    return codes


def reports(tmp: Path, n: int, first: int = 0) -> list[dict]:
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(first, first + n)]


def wait_until(condition, what: str, timeout: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def wait_for_files(tmp: Path, names: list[str], timeout: float = HANG_GUARD_S) -> None:
    wait_until(lambda: all((tmp / n).exists() for n in names), f"workers wrote {names}", timeout)


def wait_for_text(path: Path, text: str, timeout: float = HANG_GUARD_S) -> None:
    wait_until(lambda: path.exists() and text in path.read_text(), f"{path.name} says {text!r}", timeout)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def assert_all_gone(pids: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"left running: {[p for p in pids if alive(p)]}"
        time.sleep(0.1)


def all_pids(tmp: Path, n: int) -> list[int]:
    return [pid for r in reports(tmp, n) for pid in r["pids"]]


def one_line_errors(text: str) -> None:
    """No traceback and no C++ frames reach the console."""
    assert "Traceback" not in text and "frame #" not in text and "Exception raised from" not in text, text


# --------------------------------------------------------------------------- launchers on several nodes


def launcher(tmp: Path, rank: int, port: int, *extra: str, nnodes: str = "2", nproc: str = "1",
             job: tuple[str, ...] = (), name: str | None = None, join_timeout: str = "300", **launch: Any) -> Launch:
    """Node ``rank`` of a job on loopback; ``launch``: :class:`Launch`'s own options (paths, python, env)."""
    args = ["--nnodes", nnodes, "--node-rank", str(rank), "--device-num", nproc, "--addr", "127.0.0.1",
            "--port", str(port), "--join-timeout", join_timeout, "--node-timeout", "10", *extra, str(JOB), *job]
    return Launch(tmp, *args, name=name or f"node{rank}", **launch)


def rank_block(err: str, rank: int) -> str:
    """Rank ``rank``'s part of the (last) stack dump on the console."""
    start = err.rindex(f"--- rank {rank}")
    end = err.find("\n--- rank", start + 1)
    nxt = err.find("\nnpu-migrate launch:", start)
    stops = [e for e in (end, nxt) if e != -1]
    return err[start:min(stops)] if stops else err[start:]


# --------------------------------------------------------------------------- hosts as network namespaces


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"nmprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Hosts:
    """N network namespaces on one bridge-less star: host 0 is linked to every other by a veth pair.

    Host i has address ``192.0.2.(i+1)`` (TEST-NET-1, documentation addresses that route nowhere)
    on its link ``<tag>v<i>``; loopback is up in each. The host name inside is the machine's, which
    resolves to 127.0.0.1 here: the case the launcher's interface choice must handle. With more
    than two hosts, host 0 forwards between the others (each routes 192.0.2.0/24 through it), as a
    switch would: every rank reaches every other, as gloo's full mesh needs. No DNS server answers
    inside; each host's /etc/hosts is the machine's with every host's address added, as a cluster's.
    """

    def __init__(self, count: int) -> None:
        self.tag = f"nm{os.getpid() % 100000}"
        self.names = [f"{self.tag}h{i}" for i in range(count)]
        self.addrs = [f"192.0.2.{i + 1}" for i in range(count)]
        try:
            with open("/etc/hosts") as f:
                machine = f.read()
            for name in self.names:
                self._ip("netns", "add", name)
                self._ip("-n", name, "link", "set", "lo", "up")
                # As a cluster's /etc/hosts names its nodes (`ip netns exec` mounts it over /etc/hosts):
                # no DNS server answers inside a namespace.
                os.makedirs(f"/etc/netns/{name}", exist_ok=True)
                with open(f"/etc/netns/{name}/hosts", "w") as f:
                    f.write(machine.rstrip("\n") + "\n" + "".join(
                        f"{addr} {host}\n" for addr, host in zip(self.addrs, self.names)))
            for i in range(1, count):
                # Host 0 has one end per other host, each a /32 route to that host.
                a, b = f"{self.tag}a{i}", self.link(i)
                self._ip("link", "add", a, "netns", self.names[0], "type", "veth", "peer", "name", b,
                         "netns", self.names[i])
                self._ip("-n", self.names[0], "addr", "add", f"{self.addrs[0]}/32", "dev", a)
                self._ip("-n", self.names[0], "link", "set", a, "up")
                self._ip("-n", self.names[0], "route", "add", f"{self.addrs[i]}/32", "dev", a)
                self._ip("-n", self.names[i], "addr", "add", f"{self.addrs[i]}/32", "dev", b)
                self._ip("-n", self.names[i], "link", "set", b, "up")
                self._ip("-n", self.names[i], "route", "add", f"{self.addrs[0]}/32", "dev", b)
                if count > 2:
                    self._ip("-n", self.names[i], "route", "add", "192.0.2.0/24", "via", self.addrs[0], "dev", b,
                             "onlink")
            if count > 2:
                subprocess.run(["ip", "netns", "exec", self.names[0], "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                               check=True, capture_output=True, text=True)
        except BaseException:
            self.remove()
            raise

    def link(self, i: int) -> str:
        """The interface of host i (i >= 1) towards host 0."""
        return f"{self.tag}v{i}"

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def cut(self, i: int) -> None:
        """Take host i's link down: its traffic to host 0 goes nowhere (as a cut cable)."""
        self._ip("-n", self.names[i], "link", "set", self.link(i), "down")

    def pids(self, i: int) -> list[int]:
        result = subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True, text=True)
        return [int(p) for p in result.stdout.split() if p.isdigit() and alive(int(p))]

    def assert_empty(self, timeout: float = 30) -> None:
        """No process is left in any of the hosts."""
        deadline = time.monotonic() + timeout
        while any(self.pids(i) for i in range(len(self.names))):
            left = {self.names[i]: self.pids(i) for i in range(len(self.names)) if self.pids(i)}
            assert time.monotonic() < deadline, f"processes left in namespaces: {left}"
            time.sleep(0.1)

    def remove(self) -> None:
        for i, name in enumerate(self.names):
            for pid in self.pids(i) if os.path.exists(f"/run/netns/{name}") else []:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


HOSTS_PORT = "29400"
"""The launcher's --port on namespace hosts: each namespace has its own ports, so one is enough."""
HOSTS_NODE_TIMEOUT = "10"
"""--node-timeout on namespace hosts: short enough to keep the tests quick, long enough for a slow
shared CI machine."""


@pytest.fixture
def hosts():
    """Two namespace hosts (:class:`Hosts`), removed after the test; import it into a test module."""
    made = Hosts(2)
    yield made
    made.remove()


def host_launcher(tmp: Path, hosts: Hosts, rank: int, script: Path, *extra: str, name: str | None = None,
                  nproc: str = "2", job: tuple[str, ...] = (), host: int | None = None) -> Launch:
    """Node ``rank`` of a job of one node per host, on namespace host ``rank`` (or ``host``), node 0's address as ``--addr``."""
    args = ["--nnodes", str(len(hosts.names)), "--node-rank", str(rank), "--device-num", nproc, "--addr", hosts.addrs[0],
            "--port", HOSTS_PORT, "--join-timeout", "120", "--node-timeout", HOSTS_NODE_TIMEOUT, *extra,
            str(script), *job]
    # The suite's GLOO_SOCKET_IFNAME=lo would be wrong across hosts: leave the choice to the launcher.
    return Launch(tmp, *args, name=name or f"node{rank}", netns=hosts.names[rank if host is None else host],
                  env_drop=("GLOO_SOCKET_IFNAME",))


# --------------------------------------------------------------------------- torch features a test needs


HAS_ACCELERATOR = hasattr(torch, "accelerator") and hasattr(torch.distributed, "get_default_backend_for_device")
needs_accelerator = pytest.mark.skipif(
    not HAS_ACCELERATOR, reason=f"torch {torch.__version__} has no torch.accelerator (torch >= 2.6)")


def _has_fsdp2() -> bool:
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
        from torch.distributed.tensor import DTensor  # noqa: F401
    except ImportError:
        return False
    return HAS_ACCELERATOR


# FSDP2 records events on its streams; torch.cpu.Stream can only from torch 2.7 (pytorch/pytorch#145935),
# so before that FSDP2 fails on CPU ranks, with or without migration: "'Stream' object has no
# attribute 'record_event'" (torch 2.6).
FSDP2_ON_CPU = hasattr(getattr(torch.cpu, "Stream", None), "record_event")

needs_fsdp2 = pytest.mark.skipif(
    not (_has_fsdp2() and FSDP2_ON_CPU),
    reason=f"torch {torch.__version__} has no public fully_shard/DTensor and torch.accelerator, or its FSDP2 "
           "cannot run on CPU (torch.cpu.Stream.record_event, torch >= 2.7: pytorch/pytorch#145935)")


# --------------------------------------------------------------------------- migration's patched attributes


def patched_owners() -> dict[str, object]:
    """The objects runtime migration patches attributes of, by name."""
    import multiprocessing.process as mpp

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    return {
        "torch": torch, "torch.cuda": torch.cuda, "torch.cuda.amp": torch.cuda.amp, "torch.cuda.nvtx": torch.cuda.nvtx,
        "torch.Tensor": torch.Tensor, "nn.Module": torch.nn.Module, "dist": dist, "DDP": DistributedDataParallel,
        "DataLoader": DataLoader, "torch.amp": torch.amp, "autocast": torch.amp.autocast_mode.autocast,
        "SyncBatchNorm": torch.nn.SyncBatchNorm, "BaseProcess": mpp.BaseProcess,
    }


def snapshot() -> dict[str, dict[str, int]]:
    """The identity of every attribute of :func:`patched_owners`, to compare before and after."""
    return {name: {k: id(v) for k, v in vars(owner).items()} for name, owner in patched_owners().items()}


# --------------------------------------------------------------------------- the examples

EXAMPLES = ROOT / "examples"


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_rows(got: list[dict], epochs: list[int], *, world_size: int = 2, classify: bool = True,
               device: str = "cpu", backend: str = "gloo") -> None:
    assert [r["epoch"] for r in got] == epochs
    for r in got:
        assert r["samples_per_sec"] > 0 and r["elapsed_s"] > 0 and r["train_loss"] > 0 and r["test_loss"] > 0
        assert (r["world_size"], r["device"], r["backend"]) == (world_size, device, backend)
        if classify:
            assert 0 <= r["test_accuracy"] <= 1
            assert r["test_accuracy"] == r["test_correct"] / r["test_samples"]
        else:
            assert r["test_accuracy"] is None


def load_example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLES))


def write_idx(path: Path, array) -> None:
    """One file of MNIST's idx format: magic, sizes (big-endian int32), then uint8 data."""
    magic = 0x0800 + array.ndim
    path.write_bytes(struct.pack(f">{1 + array.ndim}i", magic, *array.shape) + array.tobytes())


# --------------------------------------------------------------------------- compare's recordings, written by hand


def write_probe(directory: Path, rank: int, steps: dict[int, float], *, modules: dict[int, list] | None = None,
                autocast: str | None = None, end: bool = True, world_size: int = 2, device: str = "cpu",
                float32_math: str | None = None) -> None:
    """A rank file as the probe writes it: header, step records (loss, grad_norm, lr), module records, end."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [{"kind": "header", "format": records.FORMAT, "rank": rank, "world_size": world_size, "device": device,
              "default_dtype": "float32", "seed": 0, "versions": {"torch": "x"}, "settings": {"level": "modules"}}]
    layouts: dict[tuple, int] = {}
    for step, loss in steps.items():
        lines.append({"kind": "step", "step": step, "loss": loss, "grad_norm": loss * 2, "lr": 0.1,
                      "autocast": autocast, **({"float32_math": float32_math} if float32_math else {})})
        if modules and step in modules:
            entries = tuple(e for e, _ in modules[step])
            if entries not in layouts:
                layouts[entries] = len(layouts)
                lines.append(records.layout_line(layouts[entries], entries))
            flat = [v for _, row in modules[step] for v in row]
            lines.append({"kind": "modules", "step": step, "layout": layouts[entries],
                          "stats": records.encode_stats(flat)})
    if end:
        lines.append({"kind": "end", "steps": len(steps), "level": "modules", "module_records": 1, "unmatched": []})
    with open(directory / f"rank{rank}.jsonl", "w") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")


def two_ranks(directory: Path, losses: dict[int, float], **kw) -> Path:
    for rank in (0, 1):
        write_probe(directory, rank, losses, **kw)
    return directory


LOSSES = {1: 2.3, 2: 2.1, 3: 1.9, 4: 1.7}
