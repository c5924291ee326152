"""The per-rank output relay: whole lines on the console, a prefix per rank, one log file per rank.

Usage::

    settings = output_settings(template="[${rank}]: ", ranks_filter="0,1", tee=True)   # checks input
    settings.check(nproc=2, log_dir="logs")   # filter in range; no earlier run's logs in the way

    relay = Relay(settings, cfg, run_dir, attempt)   # in the launcher, before the workers start
    relay.start()
    ...                                              # workers: attach(run_dir, local_rank) in prepare()
    relay.drain()                                    # after every worker exited: all output is out

What it owns:

* **Pipes.** Each worker's stdout and stderr are FIFOs in the job's private run directory
  (``out{L}.fifo`` and ``err{L}.fifo``), made by the launcher before the workers start. Workers
  come from a fork server, which cannot be handed new descriptors, so a named pipe the worker
  opens itself (:func:`attach`, ``dup2`` onto fds 1 and 2) is the way in; C/C++ output and
  subprocesses go through it too. The launcher keeps a write end of each open until the
  workers are gone, so a worker that has not opened its pipe yet does not look like an EOF.
* **One reader thread** for every stream (a ``selectors`` loop over non-blocking reads of up to
  1 MiB). It cuts what it read after the last line end, and writes the whole lines of one
  read with one ``write`` per destination; everything goes through this one thread, so no line
  of one rank can land inside another's. stderr stays on stderr, stdout on stdout. After a
  round that read little, the thread waits :data:`COALESCE_S` (2 ms) so that unbuffered ranks'
  many small writes are taken a few at a time.
* **Line ends.** ``\\n`` ends a line. ``\\r`` also ends a segment (progress bars such as tqdm
  redraw with ``\\r``): each segment ending in ``\\r`` is written as its own update, prefixed, so
  a bar keeps redrawing in place on its own console line and never splits another rank's line;
  an update is shown when the next one (or the final newline) arrives. ``\\r\\n`` is one line end. A last line
  without a newline at EOF gets one; a line longer than 1 MiB is written in pieces.
* **Prefix.** ``--log-line-prefix-template`` with ``${rank}``, ``${local_rank}``, ``${node_rank}``,
  ``${host}`` (torchrun's ``${hostname}`` too) and ``${role_name}`` (``--role``). With world size > 1 and no
  template, :data:`..setup.output_settings.DEFAULT_TEMPLATE` (host, node, global rank) is used; an empty template turns
  it off. The console gets the prefix; log files get the rank's bytes as written.
* **Filter.** ``--local-ranks-filter 0,1``: only those local ranks reach the console; every rank
  still goes to its log file.
* **Log files.** ``--log-dir DIR``: ``DIR/rank{N}.log`` per global rank (stdout and stderr),
  ``DIR/rank{N}.attempt{K}.log`` for restart K, so a restart never clobbers the failed attempt's
  logs. Without ``--tee`` the console shows only the launcher's own lines (as torchrun). An earlier
  run's logs are refused at start-up unless ``--log-append``; files are only ever appended to.
* **torchrun's layout.** ``--redirects``/``--tee VALUE`` (:mod:`..torchrun.logs`): each stream of each
  local rank goes to its own file, the console, or both, as the attempt's
  :class:`~.logs_layout.Destinations` say; ``--duplicate-*-filters`` copy the console lines that
  hold a filter, prefixed, to the attempt's ``filtered_stdout.log``/``filtered_stderr.log``.
* **Draining.** :meth:`Relay.drain` closes the launcher's write ends and reads until every
  stream's EOF, for at most :data:`DRAIN_S` seconds (a grandchild that left the worker's process
  group may hold a pipe forever); what is left is read without waiting and written out.

The flags are checked by :mod:`npu_migrate.launch.setup.output_settings`, their home.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import select
import selectors
import socket
import sys
import threading
import time
from string import Template
from typing import Any

from npu_migrate import fileio
from npu_migrate.launch.errors import say
from npu_migrate.launch.torchrun.logs import Destinations
from npu_migrate.launch.setup.output_settings import OutputSettings, log_path
from npu_migrate import npu_lines

__all__ = ["COALESCE_BYTES", "COALESCE_S", "DRAIN_S", "MAX_LINE", "READ_SIZE", "Relay", "attach", "fifo_paths"]

logger = logging.getLogger(__name__)

DRAIN_S = 2.0
"""Seconds :meth:`Relay.drain` waits for every stream's EOF after the workers exited."""

READ_SIZE = 1 << 20
"""Bytes read per ready stream; also the size asked for each pipe (F_SETPIPE_SZ)."""

COALESCE_S = 0.002
COALESCE_BYTES = 1 << 16
"""After a round that read less than this, the reader waits COALESCE_S before the next one."""

MAX_LINE = 1 << 20
"""A line longer than this (bytes, no line end yet) is written in pieces."""

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SEGMENT = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")


def fifo_paths(run_dir: str, local_rank: int) -> tuple[str, str]:
    """The stdout and stderr FIFOs of one worker in the job's run directory."""
    return os.path.join(run_dir, f"out{local_rank}.fifo"), os.path.join(run_dir, f"err{local_rank}.fifo")


# --------------------------------------------------------------------------- the worker's side


def attach(run_dir: str, local_rank: int) -> bool:
    """In a worker: send fds 1 and 2 into the launcher's FIFOs; False if there are none.

    Python's own buffering is left as it was (line-buffered where the launcher's console is a
    terminal, block-buffered otherwise), as if the worker still wrote to the launcher's console.
    """
    out_path, err_path = fifo_paths(run_dir, local_rank)
    fds = []
    try:
        for path in (out_path, err_path):
            # Non-blocking open: if the launcher is gone there is no reader, and this fails
            # with ENXIO instead of waiting forever.
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            fds.append(fd)
    except OSError:
        for fd in fds:
            os.close(fd)
        return False
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    for fd, target in zip(fds, (1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    return True


# --------------------------------------------------------------------------- the launcher's side


class _Stream:
    """One worker stream: its read end, the cut-off tail, and where whole lines go."""

    __slots__ = ("fd", "console", "prefix", "file", "tail", "rank", "dup", "needles")

    def __init__(self, fd: int, console: int | None, prefix: bytes, file: int | None, rank: int = -1,
                 dup: int | None = None, needles: tuple[bytes, ...] = ()) -> None:
        self.fd = fd
        self.console = console
        self.prefix = prefix
        self.file = file
        self.tail = b""
        self.rank = rank  # global rank: torch_npu's lines are counted per rank (npu_migrate.npu_lines)
        self.dup = dup  # --duplicate-*-filters: console lines holding one of the needles are copied here
        self.needles = needles


class Relay:
    """Relays one attempt's workers' output (see the module docstring).

    Args:
        settings: the checked output flags.
        cfg: the node's :class:`~npu_migrate.launch.setup.config.LaunchConfig`.
        run_dir: the job's private directory, where the FIFOs are made.
        attempt: the restart count (names the log files).
        dest: torchrun's layout for this attempt (:mod:`..torchrun.logs`: ``--redirects``, ``--tee
            VALUE``...); None: the launcher's own (``--log-dir``'s ``rank{N}.log``).
    """

    def __init__(self, settings: OutputSettings, cfg: Any, run_dir: str, attempt: int,
                 dest: Destinations | None = None) -> None:
        self.settings = settings
        self.cfg = cfg
        self.run_dir = run_dir
        self.attempt = attempt
        self.dest = dest
        self._streams: list[_Stream] = []
        self._held: list[int] = []  # the launcher's write ends: no EOF before the workers are gone
        self._files: list[int] = []
        self._selector: Any = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._stop = False
        self._console_ok = {1: True, 2: True}

    def start(self) -> None:
        """Make the FIFOs and log files, and start the reader thread."""
        cfg, settings = self.cfg, self.settings
        template = settings.prefix_template(cfg.world_size)
        host = socket.gethostname()
        to_console = not cfg.log_dir or settings.tee
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        opened: dict[str, int] = {}
        dest, logs = self.dest, settings.logs
        for local in range(cfg.nproc):
            rank = cfg.rank(local)
            prefix = Template(template).substitute(
                role_name=cfg.torchrun.role, rank=rank, local_rank=local, node_rank=cfg.node_rank,
                host=host, hostname=host,
            ).encode() if template else b""
            shown = to_console and (settings.ranks_filter is None or local in settings.ranks_filter)
            file = None
            if cfg.log_dir and dest is None:
                file = fileio.open_private_append(log_path(cfg.log_dir, rank, self.attempt))  # 0600, no symlink
                self._files.append(file)
            routes = [(file, shown, None, ()), (file, shown, None, ())]
            if dest is not None:  # torchrun's layout: each stream its own file and console (:mod:`..torchrun.logs`)
                for i, (stream, path, needles) in enumerate(((dest.out[local], dest.filtered_stdout,
                                                              logs.stdout_filters),
                                                             (dest.err[local], dest.filtered_stderr,
                                                              logs.stderr_filters))):
                    dup = self._open(opened, path) if needles and stream.console and path else None
                    routes[i] = (self._open(opened, stream.file), stream.console, dup,
                                 tuple(n.encode() for n in needles))
            for (path, console), (file, shown, dup, needles) in zip(zip(fifo_paths(self.run_dir, local), (1, 2)),
                                                                   routes):
                if os.path.exists(path):
                    os.unlink(path)
                os.mkfifo(path, 0o600)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                self._held.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                try:
                    fcntl.fcntl(fd, _F_SETPIPE_SZ, READ_SIZE)  # fewer wake-ups; over the limit it stays 64 KiB
                except OSError:
                    pass
                stream = _Stream(fd, console if shown else None, prefix, file, rank, dup, needles)
                self._streams.append(stream)
                self._selector.register(fd, selectors.EVENT_READ, stream)
        self._thread = threading.Thread(target=self._loop, name="npu_migrate-output-relay", daemon=True)
        self._thread.start()

    def _open(self, opened: dict[str, int], path: str | None) -> int | None:
        """One descriptor per file, however many streams write to it (0600, no symlink followed)."""
        if not path:
            return None
        if path not in opened:
            opened[path] = fileio.open_private_append(path)
            self._files.append(opened[path])
        return opened[path]

    # -- the reader thread

    def _loop(self) -> None:
        selector = self._selector
        while len(selector.get_map()) > 1:
            got = 0
            for key, _ in selector.select():
                stream = key.data
                if stream is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    if self._stop:
                        return
                    continue
                got += self._read(stream)
            if 0 < got < COALESCE_BYTES:
                # Unbuffered ranks write each line in two pieces: let a few arrive before the
                # next round instead of paying a round per piece (invisible to a reader).
                time.sleep(COALESCE_S)

    def _read(self, stream: _Stream) -> int:
        """Read once; the bytes read, 0 (and the stream closed at EOF) when nothing is there."""
        try:
            data = os.read(stream.fd, READ_SIZE)
        except BlockingIOError:
            return 0
        except OSError:
            data = b""
        if data:
            try:
                self._feed(stream, data)
            except Exception:  # noqa: BLE001 - never stop reading: a full pipe would stall the rank
                logger.exception("output relay: dropping a stream's output after an error")
                stream.console = stream.file = None
            return len(data)
        self._end(stream)
        return 0

    def _feed(self, stream: _Stream, data: bytes) -> None:
        if stream.tail:
            data = stream.tail + data
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut == len(data) - 1 and data[cut] == 13:
            # Ends in \r: wait for the next byte, which may make it \r\n (one line end).
            cut = max(data.rfind(b"\n", 0, cut), data.rfind(b"\r", 0, cut))
        if cut < 0:
            stream.tail = data
            if len(data) > MAX_LINE:
                stream.tail = b""
                self._emit(stream, data + b"\n")
            return
        stream.tail = data[cut + 1:]
        self._emit(stream, data[:cut + 1])

    def _emit(self, stream: _Stream, whole: bytes) -> None:
        """Write whole lines (ending in \\n or \\r) to the log file and, prefixed, the console."""
        npu_lines.COLLECTED.feed(stream.rank, whole)  # torch_npu's fallback/AiCPU/float64 lines, per rank
        if stream.file is not None:
            try:
                _write_all(stream.file, whole)
            except OSError as exc:  # a full disk: the log file stops, the job goes on
                say(f"could not write to a rank's log in --log-dir ({exc.strerror}); its output there stops.")
                stream.file = None
        if stream.console is None or not self._console_ok[stream.console]:
            return
        prefix = stream.prefix
        if not prefix:
            out = whole
        elif b"\r" not in whole:
            # The common case, at C speed: one replace, no per-line Python.
            out = prefix + whole[:-1].replace(b"\n", b"\n" + prefix) + b"\n"
        else:
            parts = []
            for seg in _SEGMENT.findall(whole):
                if seg == b"\r":
                    continue  # tqdm's leading \r: the next segment redraws the line
                parts.append(prefix + seg)
            out = b"".join(parts)
        try:
            _write_all(stream.console, out)
        except OSError:  # the reader of our output left (`| head`): keep draining, for the log files
            self._console_ok[stream.console] = False
        if stream.dup is not None:
            self._duplicate(stream, out)

    @staticmethod
    def _duplicate(stream: _Stream, shown: bytes) -> None:
        """``--duplicate-*-filters``: the console lines holding a needle, prefixed, into the filtered file."""
        picked = [line for line in shown.splitlines(keepends=True) if any(n in line for n in stream.needles)]
        if picked:
            try:
                _write_all(stream.dup, b"".join(picked))
            except OSError:
                stream.dup = None

    def _end(self, stream: _Stream) -> None:
        if stream.tail:
            tail, stream.tail = stream.tail, b""
            self._emit(stream, tail if tail.endswith(b"\n") else tail + b"\n")
        try:
            self._selector.unregister(stream.fd)
        except (KeyError, ValueError):
            pass
        os.close(stream.fd)
        stream.fd = -1

    # -- the launcher's thread

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Every worker has exited: relay what is left, then close everything (idempotent)."""
        for fd in self._held:
            os.close(fd)
        self._held = []
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            self._stop = True
            os.write(self._wake_w, b"x")
            thread.join()
        self._thread = None
        for stream in self._streams:  # a pipe still held by a grandchild: take what is there now
            for _ in range(64):  # bounded: the grandchild may write forever
                if stream.fd < 0 or not self._read(stream):
                    break
            if stream.fd >= 0:
                self._end(stream)
        self._selector.close()
        for fd in [*self._files, self._wake_r, self._wake_w]:
            os.close(fd)
        self._files = []
        for local in range(self.cfg.nproc):
            for path in fifo_paths(self.run_dir, local):
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:  # a console left non-blocking by someone else: wait until it takes more
            select.select([], [fd], [], 1.0)
            continue
        view = view[n:]

