"""Every rank's Python stack, all threads: on a hang, on ``kill -USR1 <launcher>``, and ``npu-migrate stacks PID``.

Usage::

    arm(run_dir, rank)                 # in a worker: SIGUSR1 dumps all threads to stacks-rank{N}.txt
    texts = collect(run_dir, {0: pid0, 1: pid1})   # in the launcher: signal each, read what they wrote
    print(format_stacks(texts))

    npu-migrate stacks 12345           # from another shell: the launcher with pid 12345 prints
                                       # every rank's stack on its console, and this command too

**How.** Each worker registers :func:`faulthandler.register` for SIGUSR1 with ``all_threads=True``
on its own file in the launcher's run directory. faulthandler writes from the signal handler in C,
so a rank stuck inside a collective (in C++, holding or not holding the GIL) still answers. The
launcher empties the file, signals the worker, and reads the file once its size holds still.
Fatal signals (SIGSEGV, SIGABRT...) also leave the Python stack in ``fatal-rank{N}.txt`` there,
for the failure report.

**Finding a launcher.** Its run directory is ``$TMPDIR/npu_migrate_launch_<pid>_*`` with
``launcher.json`` (pid and process start time, so a reused pid is not mistaken for it). The
launcher writes each dump to ``stacks.txt`` there, numbered on its first line; ``npu-migrate
stacks`` signals the launcher only after checking all that (SIGUSR1 would end another process),
waits for the next number and prints the file.
"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

DUMP_SIGNAL = signal.SIGUSR1
"""The signal that asks a worker (and the launcher) for stacks."""

DUMP_WAIT_S = 3.0
"""How long the launcher waits for the ranks' dumps (a rank that does not answer is named)."""

_open_files: list[Any] = []  # faulthandler keeps the fd, not the file object: keep it open


def stack_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"stacks-rank{rank}.txt")


def fatal_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"fatal-rank{rank}.txt")


def arm(run_dir: str, rank: int) -> None:
    """In a worker: SIGUSR1 dumps every thread's stack; a fatal signal leaves its stack too."""
    stacks = open(stack_path(run_dir, rank), "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the worker
    fatal = open(fatal_path(run_dir, rank), "a", encoding="utf-8")  # noqa: SIM115
    _open_files.extend([stacks, fatal])
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=False)
    faulthandler.enable(file=fatal, all_threads=True)


def collect(run_dir: str, pids: dict[int, int], wait_s: float = DUMP_WAIT_S) -> dict[int, str]:
    """Signal every rank in ``pids`` ({rank: pid}) and return what each dumped.

    A rank that could not be signalled or wrote nothing within ``wait_s`` gets a one-line note.
    """
    texts: dict[int, str] = {}
    pending: dict[int, int] = {}
    for rank, pid in pids.items():
        path = stack_path(run_dir, rank)
        try:
            os.truncate(path, 0)
            os.kill(pid, DUMP_SIGNAL)
            pending[rank] = -1
        except OSError as exc:
            texts[rank] = f"(no stack: {exc.strerror or exc})"
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank, last in list(pending.items()):
            size = os.path.getsize(stack_path(run_dir, rank))
            if size > 0 and size == last:  # written and holding still
                del pending[rank]
            else:
                pending[rank] = size
    for rank in sorted(pids):
        if rank not in texts:
            text = tidy(_read(stack_path(run_dir, rank)))
            texts[rank] = text or f"(no stack within {wait_s:g} s: the process did not answer SIGUSR1)"
    return dict(sorted(texts.items()))


def fatal_stack(run_dir: str, rank: int) -> str:
    """What faulthandler wrote when rank ``rank`` died of a fatal signal, or ""."""
    return tidy(_read(fatal_path(run_dir, rank)))


_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # launch/


def tidy(text: str) -> str:
    """faulthandler's dump without the launcher's part: its threads, and the frames under the script.

    A thread with only the launcher's frames (the flight heartbeat, the launcher watch) is left
    out; in the others, the wrapper frames of :mod:`.flight` and everything from
    ``runpy`` down (the worker's bootstrap, multiprocessing, the fork server) are dropped.
    """
    blocks, current = [], []
    for line in text.rstrip().splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x", "Fatal Python error", "Stack (most recent")) and current:
            blocks.append(current)
            current = []
        if line.strip():
            current.append(line)
    if current:
        blocks.append(current)
    kept = []
    for block in blocks:
        frames = [ln for ln in block[1:] if ln.lstrip().startswith("File ")]
        # One of the launcher's own threads: only its frames (and threading's). A rank waiting in
        # a collective has a flight.py wrapper innermost, and the script's frames below it.
        if frames and all(_OURS in f or f"{os.sep}threading.py" in f for f in frames):
            continue
        lines = [block[0]]
        for line in block[1:]:
            if "runpy" in line:
                break
            if not (line.lstrip().startswith("File ") and os.path.join(_OURS, "hangs", "flight.py") in line):
                lines.append(line)
        kept.append("\n".join(lines))
    return "\n\n".join(kept)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def format_stacks(texts: dict[int, str], states: dict[int, str] | None = None, node_rank: int | None = None) -> str:
    """The console block: one header per rank (with its collective, when known), then its threads."""
    lines = []
    for rank, text in texts.items():
        where = f" on node {node_rank}" if node_rank is not None else ""
        state = f": {states[rank]}" if states and rank in states else ""
        lines.append(f"--- rank {rank}{where}{state}")
        lines += [f"  {line}" for line in text.splitlines()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the launcher's run directory


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, from /proc), or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def mark_launcher(run_dir: str) -> None:
    """Write ``launcher.json``: from now on ``npu-migrate stacks`` may signal this process.

    Call it once SIGUSR1 is handled (:class:`npu_migrate.launch.signals.Signals`): before, the
    signal would end the launcher.
    """
    pid = os.getpid()
    with open(os.path.join(run_dir, "launcher.json"), "w", encoding="utf-8") as fh:
        json.dump({"pid": pid, "start": process_start(pid)}, fh)


def write_dump(run_dir: str, number: int, text: str) -> None:
    """Publish the launcher's dump ``number`` as ``stacks.txt`` (whole, by rename)."""
    tmp = os.path.join(run_dir, ".stacks.txt.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"dump {number}\n{text}\n")
    os.replace(tmp, os.path.join(run_dir, "stacks.txt"))


def _dump_number(run_dir: str) -> int:
    first = _read(os.path.join(run_dir, "stacks.txt")).split("\n", 1)[0]
    return int(first.split()[1]) if first.startswith("dump ") else 0


def find_run_dir(pid: int) -> str | None:
    """The run directory of the launcher with ``pid``, if that process is one of ours."""
    start = process_start(pid)
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"npu_migrate_launch_{pid}_*")):
        try:
            with open(os.path.join(path, "launcher.json"), encoding="utf-8") as fh:
                info = json.load(fh)
            if os.stat(path).st_uid != os.getuid():
                continue
        except (OSError, ValueError):
            continue
        if info.get("pid") == pid and start is not None and info.get("start") == start:
            return path
    return None


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``stacks`` to ``subparsers`` (or make a stand-alone parser)."""
    description = ("Print every rank's Python stack (all threads) of a running launcher, without stopping "
                   "anything: the same as `kill -USR1 PID`, which prints them on the launcher's console.")
    if subparsers is None:
        parser = argparse.ArgumentParser(prog="npu-migrate stacks", description=description)
    else:
        parser = subparsers.add_parser("stacks", help="Print every rank's stack of a running launcher.",
                                       description=description)
    parser.add_argument("pid", type=int, metavar="PID", help="The launcher's process id.")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="Seconds to wait for the launcher's dump (default: %(default)s).")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """``npu-migrate stacks PID``: check PID is a launcher, signal it, print its dump."""
    from npu_migrate.errors import NpuMigrateError

    pid = args.pid
    if process_start(pid) is None:
        raise NpuMigrateError(f"no process with pid {pid}: pass the pid of a running `npu-migrate launch`.")
    run_dir = find_run_dir(pid)
    if run_dir is None:
        raise NpuMigrateError(
            f"pid {pid} is not an npu-migrate launcher of this user (no run directory "
            f"{os.path.join(tempfile.gettempdir(), f'npu_migrate_launch_{pid}_*')}): pass the launcher's pid, "
            "not a rank's (or run this with the launcher's TMPDIR).")
    before = _dump_number(run_dir)
    os.kill(pid, DUMP_SIGNAL)
    deadline = time.monotonic() + args.timeout
    while _dump_number(run_dir) <= before:
        if time.monotonic() > deadline or process_start(pid) is None:
            raise NpuMigrateError(f"the launcher with pid {pid} wrote no stacks within {args.timeout:g} s "
                                  "(it may be between phases); its console may still show them.")
        time.sleep(0.05)
    text = _read(os.path.join(run_dir, "stacks.txt")).split("\n", 1)[1]
    sys.stdout.write(text)
    return 0
