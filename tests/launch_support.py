"""Helpers for the launcher's tests: launchers as real processes, files to wait on, namespaces as hosts.

Waits poll for a file or a line with a generous deadline (a hang guard, not a timing assertion).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, WORKERS, child_env

JOB = WORKERS / "launch_job.py"
HANG_GUARD_S = 120.0
"""How long a wait may take before the test fails as hung (the machine may be slow and shared)."""


class Launch:
    """One `python -m npu_migrate.launch ...` process, as a user would start it (optionally in a netns)."""

    def __init__(self, tmp: Path, *args: str, name: str = "launch", paths: tuple = (), netns: str | None = None,
                 env_drop: tuple[str, ...] = (), **env: str) -> None:
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
                [*prefix, sys.executable, "-m", "npu_migrate.launch", *args],
                env=environ, cwd=ROOT, stdout=out, stderr=err,
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
    resolves to 127.0.0.1 here: the case the launcher's interface choice must handle.
    """

    def __init__(self, count: int) -> None:
        self.tag = f"nm{os.getpid() % 100000}"
        self.names = [f"{self.tag}h{i}" for i in range(count)]
        self.addrs = [f"192.0.2.{i + 1}" for i in range(count)]
        try:
            for name in self.names:
                self._ip("netns", "add", name)
                self._ip("-n", name, "link", "set", "lo", "up")
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
