"""The version matrix: every torch a torch-npu release pairs with, each in its own venv, smoke-tested.

Usage (through the wrapper, ``.ci/matrix``, which picks the checkout's Python)::

    .ci/matrix --list                              # the lines and their pairs, read from the releases
    .ci/matrix                                     # every line (about 3 GB of downloads per line)
    .ci/matrix --lines all --prune --python .venv/bin/python   # every line, one of them in .venv
    .ci/matrix --lines 2.6.0,2.7.1 --prune         # a subset; each venv deleted after its line
    .ci/matrix --python .venv/bin/python           # a line run in an existing venv (its torch names it)

**The lines.** Nothing here names a version. The torch-npu releases on the package index
(``pip index versions torch-npu``) are grouped by release (2.7.1.post11 and 2.7.1 are one line,
2.9.0.postN and 2.9.1 two); the newest of each line is downloaded once (``pip download --no-deps``,
into ``.ci-cache/torch-npu-releases``, read in place by ``npu_migrate.releases``) and its
``Requires-Dist`` names the torch of the line (``torch==2.7.1+cpu``: PyPI's build of that release is
installed, as PyTorch's own index may be out of reach; ``npu-migrate env`` says so in its row).
The torchvision of a line is the newest one whose own METADATA declares that torch, read with
``pip install --dry-run --report`` (the wheel's METADATA, not the wheel); what each torchvision
declares is kept in ``.ci-cache/matrix/torchvision-requires.json`` (releases never change).

**The venvs.** One per line, ``.ci-cache/matrix/<torch>/`` (git-ignored), made once: the torch and
torchvision of the line, ``numpy<2`` where that torch cannot use numpy 2 (tried, not assumed), and
this checkout installed editable (under the lock .ci/run's editable installs share). ``--prune``
deletes each one after its line (a CUDA build of torch with its libraries takes about 6 GB);
``--python PATH`` runs the line of the torch installed there instead, in that venv, never pruned.

**The checks**, each with a time limit, in the line's venv, on the CPU (gloo), with a job secret
(``NPU_MIGRATE_JOB_SECRET``, 64 hex characters) for the launcher's jobs:

- ``env``: ``npu-migrate env --json`` runs, reports this torch and finds the line's release;
- ``1 node``: ``python -m npu_migrate.launch --device-num 2`` of .ci/matrix_job.py on loopback;
- ``2 nodes``: two launchers (``--nnodes 2``, one rank each) on loopback;
- ``launch --migrate``: tests/migrate/scripts/cuda_torchrun.py, an unmodified CUDA/NCCL DDP script, 2 ranks;
- ``run (mp.spawn)``: ``npu-migrate run --device-num 2`` of tests/migrate/scripts/cuda_spawn.py;
- ``port + run``: ``npu-migrate port`` of tests/port/scripts, and the ported cuda_spawn.py run as
  two nodes of one worker each, without runtime migration;
- ``ops``: ``npu-migrate ops --torch-npu <the line's newest release>`` of cuda_torchrun.py.

A job passes when it exits 0, its ranks' reports agree (every rank, the same parameters) and its
output has no traceback (one at exit, ignored by Python, is still one a user sees). Each
cell is ``ok``, ``FAILED`` (the reason below the table; the whole output in
``.ci-cache/matrix/logs/<torch>/<check>.log``) or a limit of torch itself, named with the torch
issue that explains it (:data:`UPSTREAM_LIMITS`; a limit is recognised by its error, never assumed
from the version alone). The table is printed and written into docs/ascend-versions.md (its
section "The version matrix"), with the date and the commit per row; rows of lines not run this
time are kept. Exit status: 0 when no cell failed, 1 when one did, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from npu_migrate.releases import pairs, wheels  # noqa: E402 - the checkout's, which imports no torch

CACHE = ROOT / ".ci-cache"
MATRIX = CACHE / "matrix"
RELEASES_DIR = Path(os.environ.get(wheels.ENV_CACHE) or CACHE / "torch-npu-releases")  # CI's wheel cache
TORCHVISION_REQUIRES = MATRIX / "torchvision-requires.json"
LOCK = CACHE / "editable-install.lock"  # .ci/run's editable installs take the same lock
DOC = ROOT / "docs" / "ascend-versions.md"
SECTION = "## The version matrix (`.ci/matrix`)"
JOB = ROOT / ".ci" / "matrix_job.py"
CUDA_TORCHRUN = ROOT / "tests" / "migrate" / "scripts" / "cuda_torchrun.py"
CUDA_SPAWN = ROOT / "tests" / "migrate" / "scripts" / "cuda_spawn.py"
PORT_SCRIPTS = ROOT / "tests" / "port" / "scripts"
STAMP = ".matrix-venv.json"
NEED_DISK_GB = 8  # a CUDA build of torch with its libraries, unpacked, plus pip's temporary copy
PIP = ("-m", "pip", "--disable-pip-version-check")

CHECKS = ("env", "1 node", "2 nodes", "launch --migrate", "run (mp.spawn)", "port + run", "ops")


@dataclasses.dataclass(frozen=True)
class Limit:
    """A failure torch itself causes, recognised by its error, with the torch issue that explains it."""

    check: str
    torch: str  # a PEP 440 specifier set on the torch release (">=2.4,<2.8")
    error: str  # a regular expression the check's output matches
    text: str
    issue: str  # the issue's address


UPSTREAM_LIMITS: tuple[Limit, ...] = ()
"""Failures of torch itself, not of npu_migrate: such a cell names the limit instead of failing."""


# --------------------------------------------------------------------------- processes


class Step:
    """One command with a time limit, its whole output in a log file (the process group is ended on
    timeout: a launcher's ranks go with it)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")

    def run(self, command: list[str], timeout: float, env: Optional[dict] = None,
            cwd: Optional[Path] = None) -> tuple[int, str]:
        """Run ``command``; return its exit status (124 on timeout) and its output."""
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(map(str, command))}\n")
            log.flush()
            start = len(self.log.read_text())
            proc = subprocess.Popen([str(c) for c in command], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _end_group(proc)
                status = 124
                log.write(f"\n.ci/matrix: timed out after {timeout:.0f} s\n")
            except BaseException:
                _end_group(proc)
                raise
        return status, self.log.read_text()[start:]

    def popen(self, command: list[str], env: dict, cwd: Optional[Path] = None,
              name: str = "") -> subprocess.Popen:
        """Start ``command`` in the background, its output in ``<log>.<name>``."""
        out = self.log.with_suffix(f".{name}.log")
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(map(str, command))}  (output: {out.name})\n")
        handle = out.open("w")
        try:
            return subprocess.Popen([str(c) for c in command], stdout=handle, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
        finally:
            handle.close()


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process's group, then SIGKILL to what is left of it after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _quiet(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _pip_lines(stderr: str) -> str:
    """pip's last error line, without the warnings about this machine's unreadable extra indexes."""
    lines = [line for line in stderr.strip().splitlines() if line.strip() and not line.startswith("WARNING")]
    return lines[-1] if lines else "no output"


def _free_port_pair() -> int:
    """A port ``p`` with ``p + 1`` free too (a multi-node launcher's rendezvous is on port + 1)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port >= 65535:
            continue
        with socket.socket() as second:
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports on loopback")


# --------------------------------------------------------------------------- the lines


@dataclasses.dataclass
class Line:
    """One torch a torch-npu release pairs with.

    Attributes:
        torch: the torch release installed (PyPI's version: ``2.7.1`` for ``torch==2.7.1+cpu``).
        release: the newest torch-npu release of the line (``2.7.1.post11``).
        requires: what that release declares (``torch==2.7.1+cpu``).
    """

    torch: str
    release: str
    requires: str


def index_versions(name: str) -> list[str]:
    """Every version of ``name`` on the package index, newest first (``pip index versions``)."""
    result = _quiet([sys.executable, *PIP, "index", "versions", name], timeout=300)
    match = re.search(r"^Available versions: (.+)$", result.stdout, re.M)
    if result.returncode != 0 or not match:
        raise SystemExit(f".ci/matrix: cannot list {name} on the package index: {_pip_lines(result.stderr)}")
    return [v.strip() for v in match.group(1).split(",") if v.strip()]


def _pinned(requirement: str) -> Optional[str]:
    """The one release an ``==`` requirement pins, as PyPI has it (``2.7.1`` for ``==2.7.1+cpu``)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    specs = list(Requirement(requirement).specifier)
    if len(specs) != 1 or specs[0].operator != "==":
        return None
    return Version(specs[0].version.removesuffix(".*")).public


def discover() -> list[Line]:
    """Every line, read from the newest torch-npu release of each (its wheel fetched once)."""
    from packaging.version import Version

    os.environ[wheels.ENV_CACHE] = str(RELEASES_DIR)  # where npu_migrate.releases keeps the wheels
    newest: dict[tuple, Version] = {}
    for text in index_versions(wheels.DISTRIBUTION):
        version = Version(text)
        if version.is_prerelease or version.is_devrelease:
            continue
        if version.release not in newest or version > newest[version.release]:
            newest[version.release] = version
    lines: dict[str, Line] = {}
    for version in sorted(newest.values()):
        release = wheels.find(str(version))
        requires = release.requires_torch
        torch = _pinned(requires) if requires else None
        if torch is None:
            print(f".ci/matrix: torch-npu {version} declares {requires or 'no torch'}: not one torch release; "
                  f"left out", file=sys.stderr)
            continue
        lines[torch] = Line(torch, release.version, requires)  # a newer release of the same torch wins
    return sorted(lines.values(), key=lambda line: Version(line.torch))


class TorchvisionPairs:
    """Which torchvision declares which torch, read from each torchvision's METADATA once."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}
        if TORCHVISION_REQUIRES.is_file():
            with contextlib.suppress(ValueError):
                self.known = json.loads(TORCHVISION_REQUIRES.read_text())
        self.versions: Optional[list[str]] = None
        self.unreadable: set[str] = set()

    def requires(self, version: str) -> Optional[str]:
        if version in self.known:
            return self.known[version]
        if version in self.unreadable:
            return None
        requires = self._read(version)
        if requires is None:  # tried again by the next run, not by this one
            self.unreadable.add(version)
        else:  # kept: a release's METADATA never changes
            self.known[version] = requires
            MATRIX.mkdir(parents=True, exist_ok=True)
            TORCHVISION_REQUIRES.write_text(json.dumps(self.known, indent=1, sort_keys=True) + "\n")
        return requires

    @staticmethod
    def _read(version: str) -> Optional[str]:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            result = _quiet([sys.executable, *PIP, "install", "--dry-run", "--no-deps", "--ignore-installed",
                             "--only-binary=:all:", "--quiet", "--report", str(report), f"torchvision=={version}"],
                            timeout=300)
            if result.returncode != 0 or not report.is_file():
                print(f".ci/matrix: torchvision {version}: {_pip_lines(result.stderr)}", file=sys.stderr)
                return None
            (item,) = json.loads(report.read_text())["install"]
            return pairs.requirement_of_metadata(item["metadata"].get("requires_dist") or [])

    def pair(self, torch: str) -> Optional[str]:
        """The newest torchvision whose METADATA pins ``torch`` (``torch==2.6.0``), else the newest that
        accepts it (0.29.1 declares ``torch>=2.14.0``); None: no release does."""
        if self.versions is None:
            self.versions = index_versions("torchvision")
        accepting = []
        for version in self.versions:
            requires = self.requires(version)
            if requires and pairs.accepts(requires, torch):
                if _pinned(requires) == torch:
                    return version
                accepting.append(version)
        return accepting[0] if accepting else None


# --------------------------------------------------------------------------- the venvs


@dataclasses.dataclass
class Venv:
    python: Path
    torch: str  # as installed: 2.13.0+cpu, 2.7.1+cu126
    torchvision: str
    notes: list[str]
    ours: bool  # made by .ci/matrix (pruned with --prune)


def _installed(python: Path, *names: str) -> dict[str, Optional[str]]:
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(n):\n"
            "    try:\n        return m.version(n)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    result = _quiet([str(python), "-c", code, *names], timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{python} cannot run: {_pip_lines(result.stderr)}")
    return json.loads(result.stdout)


def _torch_build(python: Path) -> str:
    """``torch.__version__`` there (``2.7.1+cu126``: which build of the release pip installed)."""
    result = _quiet([str(python), "-c", "import torch; print(torch.__version__)"], timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"import torch fails in {python}: {_pip_lines(result.stderr)}")
    return result.stdout.strip().splitlines()[-1]


def _numpy_works(python: Path, step: Step, timeout: float) -> bool:
    """Whether this torch works with the numpy installed (torch built against numpy 1.x warns or fails
    on numpy 2: 'A module that was compiled using NumPy 1.x cannot be run in NumPy 2...')."""
    code = "import numpy, torch; assert torch.from_numpy(numpy.arange(3.0)).sum().item() == 3.0; torch.ones(2).numpy()"
    status, output = step.run([python, "-c", code], timeout=timeout)
    return status == 0 and "NumPy 1.x" not in output and "_ARRAY_API" not in output


@contextlib.contextmanager
def _editable_lock() -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_venv(line: Line, torchvision: str, step: Step, timeout: float) -> Venv:
    """The line's venv in .ci-cache/matrix/<torch>/, made once (reused while its stamp holds)."""
    directory = MATRIX / line.torch
    python = directory / "bin" / "python"
    stamp = directory / STAMP
    if stamp.is_file() and python.exists():
        with contextlib.suppress(ValueError, KeyError, RuntimeError):
            made = json.loads(stamp.read_text())
            have = _installed(python, "torch", "torchvision", "npu-migrate")
            if made["line"] == line.torch and have["torch"] == made["torch"] and have["npu-migrate"]:
                return Venv(python, made["build"], have["torchvision"] or "-", made["notes"] + ["venv reused"], True)
    if directory.exists():
        shutil.rmtree(directory)  # a venv left half-made
    free_gb = shutil.disk_usage(MATRIX.parent if MATRIX.parent.exists() else ROOT).free / 2**30
    if free_gb < NEED_DISK_GB:
        raise RuntimeError(f"{free_gb:.1f} GB free on disk, a line needs about {NEED_DISK_GB} GB "
                           f"(run with --prune, or delete .ci-cache/matrix/*/)")
    directory.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(deadline - time.monotonic(), 1.0)

    def must(command: list, what: str) -> None:
        status, output = step.run(command, timeout=left())
        if status != 0:
            raise RuntimeError(f"{what} failed (exit {status}): {_pip_lines(output)}")

    must([sys.executable, "-m", "venv", directory], "python -m venv")
    wants = [f"torch=={line.torch}", f"torchvision=={torchvision}"]
    pip = [python, *PIP, "install", "--only-binary=:all:", "--progress-bar", "off"]
    must([*pip, *wants], f"pip install {' '.join(wants)}")
    notes = []
    if not _numpy_works(python, step, left()):
        wants.append("numpy<2")
        must([*pip, "numpy<2"], "pip install numpy<2")
        if not _numpy_works(python, step, left()):
            raise RuntimeError(f"torch {line.torch} fails with numpy 1.x too (see {step.log})")
        notes.append("numpy<2 (this torch was built against numpy 1.x)")
    with _editable_lock():  # two editable builds at once would share the checkout's build metadata
        must([python, *PIP, "install", "--progress-bar", "off", "-e", ROOT, *wants], "pip install -e .")
    have = _installed(python, "torch", "torchvision")
    build = _torch_build(python)
    stamp.write_text(json.dumps({"line": line.torch, "torch": have["torch"], "build": build, "notes": notes}) + "\n")
    return Venv(python, build, have["torchvision"] or "-", notes, True)


def given_venv(python: Path) -> tuple[str, Venv]:
    """An existing environment given with --python: the torch release installed there and the venv."""
    from packaging.version import Version

    python = Path(os.path.abspath(python))  # not resolved: a venv's python is a link out of it
    have = _installed(python, "torch", "torchvision", "npu-migrate")
    if not have["torch"]:
        raise SystemExit(f".ci/matrix: --python {python}: torch is not installed there")
    check = _quiet([str(python), "-c", "import npu_migrate; print(npu_migrate.__file__)"], timeout=120)
    if check.returncode != 0 or not Path(check.stdout.strip()).resolve().is_relative_to(ROOT):
        raise SystemExit(f".ci/matrix: --python {python} does not import this checkout's npu_migrate "
                         f"(install it there: {python} -m pip install -e {ROOT})")
    return Version(have["torch"]).public, Venv(python, _torch_build(python), have["torchvision"] or "-",
                                                [f"run in an existing venv ({_shown(python.parent.parent)})"], False)


def _shown(path: Path) -> str:
    """A path as the docs show it: relative to the checkout where it is inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# --------------------------------------------------------------------------- the checks


@dataclasses.dataclass
class Cell:
    status: str  # ok, FAILED, limit
    detail: str = ""
    seconds: float = 0.0
    log: Optional[Path] = None

    def text(self) -> str:
        if self.status == "limit":
            return f"limit: {self.detail}"
        return self.status


class CheckFailed(Exception):
    """A check's outcome was wrong; the message says what the user would see."""


def _reason(output: str) -> str:
    """The line of a failed command's output that says why: the last exception raised (``KeyError: ...``),
    else the last line that names an error, else its last line."""
    lines = [_PREFIX.sub("", line).strip() for line in output.splitlines()
             if line.strip() and not line.startswith("$ ")]
    raised = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b", line)]
    errors = [line for line in lines if re.search(r"error|exception|failed|cannot|timed out", line, re.I)]
    found = (raised or errors or lines or ["no output"])[-1]
    return found if len(found) <= 300 else found[:297] + "..."


_PREFIX = re.compile(r"^\[[^\]]*\] ")  # the launcher's prefix of a rank's line ([host node0 rank1])


def _traceback(output: str) -> str:
    """The first traceback in ``output``, in one line (what raised it, and where it was ignored), or ''."""
    lines = [_PREFIX.sub("", line).rstrip() for line in output.splitlines()]
    for index, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            raised = next((later for later in lines[index + 1:] if later and not later[0].isspace()), "?")
            before = lines[index - 1] if index and lines[index - 1].startswith("Exception ignored") else ""
            before = re.sub(r" at 0x[0-9a-f]+", "", before)
            return f"{raised}{f' ({before})' if before else ''}"
    return ""


def _whole_log(log: Path) -> str:
    """A check's log and its processes' own logs (a node's output is in ``<check>.node0.log``)."""
    text = log.read_text() if log.is_file() else ""
    for other in sorted(log.parent.glob(f"{log.stem}.*.log")):
        text += other.read_text()
    return text


def _reports(out: Path, ranks: int) -> list[dict]:
    found = []
    for rank in range(ranks):
        path = out / f"rank{rank}.json"
        if not path.is_file():
            raise CheckFailed(f"rank {rank} wrote no report ({path.name} missing)")
        found.append(json.loads(path.read_text()))
    if [r["rank"] for r in found] != list(range(ranks)):
        raise CheckFailed(f"ranks reported {[r['rank'] for r in found]}")
    if any(r["params"] != found[0]["params"] for r in found):
        raise CheckFailed("the ranks ended with different parameters")
    return found


class Checks:
    """The smoke set of one line, run in its venv."""

    def __init__(self, line: Line, venv: Venv, logs: Path, work: Path, timeout: float) -> None:
        self.line, self.venv, self.logs, self.work, self.timeout = line, venv, logs, work, timeout
        self.secret = secrets.token_hex(32)

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "NPU_MIGRATE_JOB_SECRET")}
        env.update(NPU_MIGRATE_RELEASES_DIR=str(RELEASES_DIR), NPU_MIGRATE_DEVICE="cpu", **extra)
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def run_all(self, report: Callable[[str, Cell], None]) -> dict[str, Cell]:
        cells = {}
        for name, method in zip(CHECKS, (self.check_env, self.one_node, self.two_nodes, self.migrate,
                                         self.run_spawn, self.port, self.ops)):
            slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
            step = Step(self.logs / f"{slug}.log")
            out = self.work / slug
            out.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            try:
                method(step, out)
                cell = Cell("ok")
                shown = _traceback(_whole_log(step.log))
                if shown:  # it worked, but a user would see a traceback
                    cell = Cell("FAILED", f"exit 0, but the output has a traceback: {shown}")
            except CheckFailed as failure:
                cell = Cell("FAILED", str(failure))
            except Exception as exc:  # noqa: BLE001 - a check that crashed is a failed cell, not a crashed matrix
                cell = Cell("FAILED", f"{type(exc).__name__}: {exc}")
            cell.seconds, cell.log = time.monotonic() - started, step.log
            if cell.status == "FAILED":
                cell = _upstream(name, self.venv.torch, step.log, cell)
            cells[name] = cell
            report(name, cell)
        return cells

    def _must(self, step: Step, command: list, out: Path, **extra: str) -> str:
        status, output = step.run(command, timeout=self.timeout, env=self.env(OUT_DIR=str(out), **extra), cwd=out)
        if status != 0:
            raise CheckFailed(f"exit {status}: {_reason(output)}")
        return output

    def check_env(self, step: Step, out: Path) -> None:
        from packaging.version import Version

        output = self._must(step, [self.venv.python, "-m", "npu_migrate", "env", "--json"], out)
        found = json.loads(output[output.index("{"):])
        if Version(found["torch_version"]).public != Version(self.venv.torch).public:
            raise CheckFailed(f"env reports torch {found['torch_version']}, {self.venv.torch} is installed")
        said = found.get("torch_npu_pairing") or found.get("pairing_source") or ""
        if self.line.release not in said:
            raise CheckFailed(f"env does not name torch-npu {self.line.release}, the release of torch "
                              f"{self.line.torch}: it says {said!r}")

    def one_node(self, step: Step, out: Path) -> None:
        self._must(step, [self.venv.python, "-m", "npu_migrate.launch", "--device", "cpu", "--device-num", "2",
                          JOB], out, NPU_MIGRATE_JOB_SECRET=self.secret)
        got = _reports(out, 2)
        if any((r["world_size"], r["backend"], r["all_reduce_sum"]) != (2, "gloo", 3.0) for r in got):
            raise CheckFailed(f"the ranks saw {[(r['world_size'], r['backend'], r['all_reduce_sum']) for r in got]}")

    def _nodes(self, step: Step, commands: dict[int, list], env: dict, out: Path, what: str) -> None:
        """Start one process per node (in this order), wait for all within the check's time limit, and
        fail with the first node that did not exit 0 (its output goes into the check's log too)."""
        nodes = {node: step.popen(command, env=env, cwd=out, name=f"node{node}") for node, command in commands.items()}
        deadline = time.monotonic() + self.timeout
        status = {}
        try:
            for node, proc in nodes.items():
                try:
                    status[node] = proc.wait(timeout=max(deadline - time.monotonic(), 1))
                except subprocess.TimeoutExpired:
                    status[node] = 124
        finally:
            for proc in nodes.values():
                if proc.poll() is None:
                    _end_group(proc)
        failed = sorted(node for node, code in status.items() if code != 0)
        if failed:
            node = failed[0]
            log = step.log.with_suffix(f".node{node}.log")
            text = log.read_text() if log.is_file() else ""
            timed_out = " (timed out)" if status[node] == 124 else ""
            raise CheckFailed(f"{what}, node {node}: exit {status[node]}{timed_out}: {_reason(text)}")

    def two_nodes(self, step: Step, out: Path) -> None:
        port = _free_port_pair()
        common = ["-m", "npu_migrate.launch", "--device", "cpu", "--nnodes", "2", "--device-num", "1",
                  "--addr", "127.0.0.1", "--port", str(port), "--join-timeout", "120"]
        commands = {node: [self.venv.python, *common, "--node-rank", str(node), JOB] for node in (1, 0)}
        self._nodes(step, commands, self.env(OUT_DIR=str(out), NPU_MIGRATE_JOB_SECRET=self.secret), out, "launcher")
        got = _reports(out, 2)
        if sorted(r["node_rank"] for r in got) != [0, 1] or any(r["all_reduce_sum"] != 3.0 for r in got):
            raise CheckFailed(f"the ranks saw {[(r['node_rank'], r['all_reduce_sum']) for r in got]}")

    def migrate(self, step: Step, out: Path) -> None:
        self._must(step, [self.venv.python, "-m", "npu_migrate.launch", "--migrate", "--device", "cpu",
                          "--device-num", "2", CUDA_TORCHRUN], out, NPU_MIGRATE_JOB_SECRET=self.secret)
        got = _reports(out, 2)
        seen = [(r["backend"], r["cuda_available"], r["device_count"]) for r in got]
        if any(s != ("gloo", True, 2) for s in seen):
            raise CheckFailed(f"the ranks saw (backend, cuda available, devices) {seen}")

    def run_spawn(self, step: Step, out: Path) -> None:
        port = _free_port_pair()
        self._must(step, [self.venv.python, "-m", "npu_migrate", "run", "--device", "cpu", "--device-num", "2",
                          CUDA_SPAWN, "--world-size", "1", "--rank", "0", "--port", str(port), "--out", out], out)
        got = _reports(out, 2)
        if any((r["world_size"], r["backend"]) != (2, "gloo") for r in got):
            raise CheckFailed(f"the ranks saw {[(r['world_size'], r['backend']) for r in got]}")

    def port(self, step: Step, out: Path) -> None:
        ported = out / "ported"
        self._must(step, [self.venv.python, "-m", "npu_migrate", "port", PORT_SCRIPTS, "--out", ported], out)
        script = ported / "cuda_spawn.py"
        text = script.read_text()
        left = [word for word in ("torch.cuda", ".cuda(", "nccl") if word in text]
        if left or "import npu_migrate as nm" not in text:
            raise CheckFailed(f"the ported {script.name} still has {left or 'no npu_migrate import'}")
        port = _free_port_pair()
        commands = {node: [self.venv.python, script, "--world-size", "2", "--rank", str(node), "--port", str(port),
                           "--out-dir", out] for node in (0, 1)}
        self._nodes(step, commands, self.env(), out, "the ported script")
        got = _reports(out, 2)
        if any(r["world_size"] != 2 for r in got):
            raise CheckFailed(f"world sizes {[r['world_size'] for r in got]}")

    def ops(self, step: Step, out: Path) -> None:
        report = out / "ops.json"
        status, output = step.run([self.venv.python, "-m", "npu_migrate", "ops", "--torch-npu", self.line.release,
                                   "--json", report, CUDA_TORCHRUN], timeout=self.timeout,
                                  env=self.env(OUT_DIR=str(out)), cwd=out)
        if status not in (0, 1) or not report.is_file():  # 1: operators that fall back, a verdict, not a failure
            raise CheckFailed(f"exit {status}: {_reason(output)}")
        found = json.loads(report.read_text())
        if found["torch_npu"] != self.line.release or found["steps"] != 2 or "--steps" not in found["ended"]:
            raise CheckFailed(f"the audit judged torch-npu {found['torch_npu']}, {found['steps']} step(s), "
                              f"{found['ended']}")


def _upstream(check: str, torch: str, log: Optional[Path], cell: Cell) -> Cell:
    """The failed cell as a limit of torch itself where its error is one (:data:`UPSTREAM_LIMITS`)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    text = _whole_log(log) if log else ""
    for limit in UPSTREAM_LIMITS:
        if (limit.check == check and Version(torch).public in SpecifierSet(limit.torch)
                and re.search(limit.error, text)):
            return Cell("limit", f"{limit.text} ([{_issue_name(limit.issue)}]({limit.issue}))", cell.seconds, log)
    return cell


def _issue_name(url: str) -> str:
    match = re.search(r"github\.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)", url)
    return f"{match.group(1)}#{match.group(2)}" if match else url


# --------------------------------------------------------------------------- the table


@dataclasses.dataclass
class Row:
    line: Line
    torch: str = "-"
    torchvision: str = "-"
    notes: list = dataclasses.field(default_factory=list)
    cells: dict = dataclasses.field(default_factory=dict)
    install_s: float = 0.0
    total_s: float = 0.0
    checked: str = ""

    def failed(self) -> bool:
        return any(cell.status == "FAILED" for cell in self.cells.values())


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def render(rows: list[Row]) -> tuple[list[str], list[str]]:
    """The table's rows (markdown) and the notes below it (why each cell failed, each line's notes)."""
    table, notes = [], []
    for row in rows:
        cells = [row.cells[c].text() if c in row.cells else "not run" for c in CHECKS]
        declared = f"{row.line.release} (`{row.line.requires}`)"
        took = f"{_minutes(row.total_s)} ({_minutes(row.install_s)} install)"
        table.append("| " + " | ".join([row.line.torch, row.torch, row.torchvision, declared, *cells, took,
                                        row.checked]) + " |")
        failed = {check: cell.detail for check, cell in row.cells.items() if cell.status == "FAILED"}
        if len(failed) == len(CHECKS) and len(set(failed.values())) == 1:  # the venv could not be made
            failed = {"every check": next(iter(failed.values()))}
        for check, detail in failed.items():
            notes.append(f"- torch {row.line.torch}, **{check}**: {detail.replace('|', '/')}")
        for note in row.notes:
            notes.append(f"- torch {row.line.torch}: {note}")
    return table, notes


HEADER = ["| torch | installed | torchvision | torch-npu (declares) | " + " | ".join(CHECKS) + " | time | checked |",
          "|---|---|---|---|" + "---|" * len(CHECKS) + "---|---|"]


def _git(*args: str) -> str:
    result = _quiet(["git", "-C", str(ROOT), *args], timeout=60)
    return result.stdout.strip() if result.returncode == 0 else ""


def revision() -> str:
    """The commit checked, with a ``+`` where the checkout had uncommitted changes to tracked files."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    # The doc this script writes after each line is not what it checks.
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", f":!{DOC.relative_to(ROOT)}",
                 f":!{CHECKED.relative_to(ROOT)}")
    return commit + ("+" if dirty else "")


def write_doc(rows: list[Row], started: str, commit: str) -> None:
    """Replace the matrix section of docs/ascend-versions.md, keeping the rows of lines not run."""
    text = DOC.read_text()
    begin = text.find(SECTION)
    old_rows: dict[str, str] = {}
    old_notes: dict[str, list[str]] = {}
    if begin >= 0:
        end = text.find("\n## ", begin + len(SECTION))
        end = len(text) if end < 0 else end + 1
        for line in text[begin:end].splitlines():
            row = re.match(r"^\| (\d[^ |]*) \|", line)
            note = re.match(r"^- torch (\d[^ ,:]*)[,:]", line)
            if row:
                old_rows[row.group(1)] = line
            elif note:
                old_notes.setdefault(note.group(1), []).append(line)
    else:  # the first run: the section goes at the end
        text = text.rstrip("\n") + "\n\n"
        begin = end = len(text)
    from packaging.version import Version

    table, notes = render(rows)
    ran = {row.line.torch for row in rows}
    merged = {row.line.torch: line for row, line in zip(rows, table)}
    merged.update({torch: line for torch, line in old_rows.items() if torch not in ran})
    kept_notes = [n for torch, lines in old_notes.items() if torch not in ran for n in lines]
    order = sorted(merged, key=Version)
    all_notes = sorted(kept_notes + notes, key=lambda n: Version(re.match(r"^- torch (\d[^ ,:]*)", n).group(1)))
    section = [
        SECTION,
        "",
        "`.ci/matrix` (not part of `.ci/run`: about 3 GB of downloads per line) installs every torch a",
        "torch-npu release pairs with, each once into its own venv (`.ci-cache/matrix/<torch>/`), and runs",
        "a smoke set there on the CPU: `env`; a launcher job of 2 ranks on one node and one of 2 nodes on",
        "loopback, both with a job secret; `launch --migrate` of an unmodified CUDA script; `npu-migrate run`",
        "of an `mp.spawn` script; `port` of CUDA scripts, then the ported one run; `ops` against the line's",
        "newest torch-npu release. The lines and their pairs are read from the releases' METADATA (the newest",
        "release of each line); torchvision is the newest one whose METADATA declares that torch. PyPI's",
        "build of each torch is installed: where a release declares the `+cpu` build of PyTorch's index,",
        "`env` says the pair is not the declared one. How it works and its options: `.ci/matrix --help`.",
        "",
        "```bash",
        ".ci/matrix --prune                          # every line, each venv deleted after its line",
        ".ci/matrix --lines 2.6.0,2.7.1              # a subset",
        ".ci/matrix --python .venv/bin/python        # the line of the torch in an existing venv",
        "```",
        "",
        "A cell is `ok`, `FAILED` (why, below) or a limit of torch itself, with the torch issue that",
        "explains it. Time: the line's whole run, its venv's set-up in brackets (0 where the venv existed).",
        "Checked: the date and the commit the checks ran (`+`: with uncommitted changes in the checkout;",
        "`A` to `B`: the checkout changed while the line ran).",
        "",
        f"Last run: {started}, commit `{commit}`, lines {', '.join(sorted(ran, key=Version))}.",
        "",
        *HEADER,
        *(merged[torch] for torch in order),
    ]
    if all_notes:
        section += ["", *all_notes]
    DOC.write_text(text[:begin] + "\n".join(section) + "\n" + ("\n" + text[end:] if text[end:] else ""))
    write_checked([merged[torch] for torch in order])


CHECKED = ROOT / "npu_migrate" / "releases" / "checked.json"
"""The table's rows as data, shipped with the package (:mod:`npu_migrate.releases.checked`, ``env``)."""


def write_checked(table: list[str]) -> None:
    """Write the table's rows (markdown) into :data:`CHECKED`: each line, ok or not, its date and commit."""
    rows = []
    for line in table:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        when = re.match(r"^(\S+), (.*)$", cells[-1])
        rows.append({"torch": cells[0], "ok": all(cell == "ok" for cell in cells[4:4 + len(CHECKS)]),
                     "date": when.group(1) if when else cells[-1],
                     "commit": when.group(2).replace("`", "") if when else None})
    CHECKED.write_text(json.dumps({"source": ".ci/matrix (docs/ascend-versions.md)", "lines": rows}, indent=1)
                       + "\n")


# --------------------------------------------------------------------------- main


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=".ci/matrix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", metavar="TORCH,...",
                        help="run only these lines, by torch release (e.g. 2.6.0,2.7.1), or all (the default, "
                             "except with --python alone: the lines of those Pythons)")
    parser.add_argument("--python", metavar="PATH", action="append", default=[], type=Path,
                        help="run the line of the torch installed in this Python's environment there, instead of "
                             "making a venv (repeatable; needs this checkout's npu_migrate installed there)")
    parser.add_argument("--prune", action="store_true",
                        help="delete each venv .ci/matrix made after its line (about 6 GB each)")
    parser.add_argument("--list", action="store_true", help="print the lines and their pairs, and exit")
    parser.add_argument("--no-doc", action="store_true", help="do not write the table into docs/ascend-versions.md")
    parser.add_argument("--install-timeout", type=float, default=3600, metavar="S",
                        help="seconds for a line's venv to be made (default: 3600)")
    parser.add_argument("--check-timeout", type=float, default=600, metavar="S",
                        help="seconds for each check (default: 600)")
    parser.add_argument("--nice", type=int, default=10, help="run at this niceness (default: 10)")
    return parser.parse_args(argv)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # through the running step's clean-up: its process group is ended


def main(argv: Optional[list[str]] = None) -> int:
    args = _parse(argv)
    # Stopped by Ctrl-C or kill: end the step running (a pip, a launcher and its ranks) before leaving,
    # also where the shell started this in the background with SIGINT ignored.
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    from packaging.version import InvalidVersion, Version

    given: dict[str, Venv] = {}
    for python in args.python:
        if not python.exists():
            print(f".ci/matrix: error: --python {python}: no such file", file=sys.stderr)
            return 2
        torch, venv = given_venv(python)
        given[torch] = venv
    lines = discover()
    by_torch = {line.torch: line for line in lines}
    if args.list:
        tv = TorchvisionPairs()
        for line in lines:
            print(f"torch {line.torch:8} torchvision {tv.pair(line.torch) or '-':8} "
                  f"torch-npu {line.release} declares {line.requires}")
        return 0
    unknown = [t for t in given if t not in by_torch]
    if unknown:
        print(f".ci/matrix: error: --python: torch {', '.join(unknown)} is no torch a torch-npu release pairs "
              f"with (lines: {', '.join(by_torch)})", file=sys.stderr)
        return 2
    if args.lines and args.lines.strip() != "all":
        wanted = [w.strip() for w in args.lines.split(",") if w.strip()]
        try:
            wanted = [str(Version(w)) for w in wanted]
        except InvalidVersion as exc:
            print(f".ci/matrix: error: --lines: {exc}", file=sys.stderr)
            return 2
        missing = [w for w in wanted if w not in by_torch]
        if missing:
            print(f".ci/matrix: error: --lines: {', '.join(missing)} is no torch a torch-npu release pairs with "
                  f"(lines: {', '.join(by_torch)})", file=sys.stderr)
            return 2
        lines = [by_torch[w] for w in wanted]
    elif given and not args.lines:
        lines = [by_torch[t] for t in given]  # --python alone: just those lines
    with contextlib.suppress(PermissionError, OSError):
        os.nice(args.nice)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = revision()
    tv = TorchvisionPairs()
    rows: list[Row] = []
    print(f".ci/matrix: {len(lines)} line(s): {', '.join(line.torch for line in lines)}; commit {commit}", flush=True)
    for line in lines:
        row = Row(line, checked=f"{started[:10]}, `{commit}`")
        rows.append(row)
        started_line = time.monotonic()
        logs = MATRIX / "logs" / line.torch
        if logs.exists():
            shutil.rmtree(logs)
        venv: Optional[Venv] = given.get(line.torch)
        try:
            if venv is None:
                torchvision = tv.pair(line.torch)
                if torchvision is None:
                    raise RuntimeError(f"no torchvision release declares torch {line.torch}")
                print(f"[{line.torch}] setting up .ci-cache/matrix/{line.torch}: torch=={line.torch} "
                      f"torchvision=={torchvision}", flush=True)
                venv = build_venv(line, torchvision, Step(logs / "install.log"), args.install_timeout)
            row.torch, row.torchvision, row.notes = venv.torch, venv.torchvision, list(venv.notes)
        except (RuntimeError, OSError) as exc:
            row.install_s = row.total_s = time.monotonic() - started_line
            row.cells = {check: Cell("FAILED", f"no venv: {exc}") for check in CHECKS}
            print(f"[{line.torch}] set-up FAILED: {exc} (log: {logs / 'install.log'})", flush=True)
            _prune(line, args.prune)
            if not args.no_doc:
                write_doc(rows, started, commit)
            continue
        row.install_s = time.monotonic() - started_line if "venv reused" not in venv.notes and venv.ours else 0.0
        print(f"[{line.torch}] torch {venv.torch}, torchvision {venv.torchvision}; "
              f"set-up {row.install_s:.0f} s", flush=True)

        def say(check: str, cell: Cell, torch: str = line.torch) -> None:
            where = f" (log: {cell.log})" if cell.status != "ok" else ""
            detail = f": {cell.detail}" if cell.detail else ""
            print(f"[{torch}] {check}: {cell.status}{detail} ({cell.seconds:.0f} s){where}", flush=True)

        # The checks import the checkout's npu_migrate, which others may commit to while a line runs
        # (a whole matrix takes about an hour): the row names the commit its checks ran, both ends.
        before = revision()
        with tempfile.TemporaryDirectory(prefix=f"matrix-{line.torch}-") as work:
            row.cells = Checks(line, venv, logs, Path(work), args.check_timeout).run_all(say)
        after = revision()
        row.checked = f"{started[:10]}, `{before}`" + (f" to `{after}`" if after != before else "")
        if after != before:
            print(f"[{line.torch}] the checkout changed during the checks: {before} to {after}", flush=True)
        row.total_s = time.monotonic() - started_line
        print(f"[{line.torch}] done in {_minutes(row.total_s)}", flush=True)
        if venv.ours:
            _prune(line, args.prune)
        if not args.no_doc:
            write_doc(rows, started, commit)  # after each line: a run cut short keeps what it found
    table, notes = render(rows)
    print("\n" + "\n".join([*HEADER, *table, *([""] + notes if notes else [])]))
    if not args.no_doc:
        print(f"\n.ci/matrix: the table is in {DOC.relative_to(ROOT)} ({SECTION.lstrip('# ')})")
    return 1 if any(row.failed() for row in rows) else 0


def _prune(line: Line, prune: bool) -> None:
    if prune and (MATRIX / line.torch).exists():
        shutil.rmtree(MATRIX / line.torch)


if __name__ == "__main__":
    sys.exit(main())
