"""Whole lines from the processes an ``mp.spawn`` script starts under ``npu-migrate run``, each with its rank prefix.

Usage::

    from npu_migrate.migrate import lines

    relay = lines.start_for_spawn_child(process)   # in the child, before the worker function runs
    ...
    relay.close()                                  # after it: every line is out

The launcher relays whole lines for the ranks it starts (:mod:`npu_migrate.launch.procs.output`);
``npu-migrate run`` starts one process, and the children ``torch.multiprocessing.spawn`` makes
share its stdout and stderr. Unbuffered, ``print`` writes the text and the newline separately, so
two ranks' lines arrived as one ("loss=0.530ACCEPT-OK rank=0 ...").

Each spawned child (``NPU_MIGRATE_WHOLE_LINES=1``, set by ``npu-migrate run``) therefore puts a
pipe on its fds 1 and 2 (Python, C++ and subprocess output alike go through it) and a reader
thread per stream writes what arrives in whole lines, one ``os.write`` per read, to the
descriptor the child inherited: writes of up to ``PIPE_BUF`` bytes to a pipe are atomic, so no
line of one rank lands inside another's. Prefix: the launcher's rule, :data:`DEFAULT_TEMPLATE`
with ``${rank}`` and ``${local_rank}`` the spawn index, when ``nprocs`` > 1 (the parent passes it
in ``NPU_MIGRATE_SPAWN_NPROCS``). Other multiprocessing children (DataLoader workers) are left
as they are.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from string import Template
from typing import Any

from npu_migrate.launch.procs.output import DRAIN_S
from npu_migrate.launch.setup.output_settings import DEFAULT_TEMPLATE
from npu_migrate.migrate.environment import ENV_SPAWN_NPROCS, ENV_WHOLE_LINES

READ_SIZE = 1 << 16
"""Bytes read at a time; a line longer than what is buffered is written when its end arrives."""


class LineRelay:
    """Fds 1 and 2 of this process go through pipes; one thread each writes them on in whole lines."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.encode()
        self.threads: list[threading.Thread] = []
        self.saved: dict[int, int] = {}
        for fd in (1, 2):
            self.saved[fd] = os.dup(fd)  # where the lines go: what the child inherited
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(target=self._relay, args=(read_end, self.saved[fd]), daemon=True,
                                      name=f"npu_migrate-lines-{fd}")
            thread.start()
            self.threads.append(thread)

    def _relay(self, read_end: int, out: int) -> None:
        pending = b""
        while True:
            try:
                data = os.read(read_end, READ_SIZE)
            except OSError:
                data = b""
            if not data:
                break
            pending += data
            cut = pending.rfind(b"\n") + 1
            if cut:
                self._write(out, pending[:cut])
                pending = pending[cut:]
        if pending:
            self._write(out, pending + b"\n")  # a last line without its newline gets one
        os.close(read_end)

    def _write(self, out: int, whole: bytes) -> None:
        text = b"".join(self.prefix + line for line in whole.splitlines(keepends=True))
        while text:
            try:
                written = os.write(out, text)
            except OSError:
                return
            text = text[written:]

    def close(self) -> None:
        """Flush Python's buffers, put the inherited descriptors back and wait for the last lines."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        for fd, saved in self.saved.items():
            os.dup2(saved, fd)  # closes the pipe's write end: the reader sees EOF once children let go
        for thread in self.threads:
            thread.join(DRAIN_S)
        for saved in self.saved.values():
            os.close(saved)


def spawn_index(process: Any) -> int | None:
    """The index ``torch.multiprocessing.spawn`` gave ``process`` (its worker's first argument), or None."""
    target = getattr(process, "_target", None)
    if getattr(target, "__module__", "") != "torch.multiprocessing.spawn" or getattr(target, "__name__", "") != "_wrap":
        return None
    args = getattr(process, "_args", ())
    return args[1] if len(args) > 1 and isinstance(args[1], int) else None


def start_for_spawn_child(process: Any) -> LineRelay | None:
    """A :class:`LineRelay` for a child ``mp.spawn`` started under ``npu-migrate run``, else None."""
    if os.environ.get(ENV_WHOLE_LINES) != "1":
        return None
    index = spawn_index(process)
    if index is None:
        return None
    nprocs = os.environ.get(ENV_SPAWN_NPROCS, "")
    prefix = ""
    if nprocs.isdigit() and int(nprocs) > 1:
        prefix = Template(DEFAULT_TEMPLATE).safe_substitute(
            host=socket.gethostname(), node_rank=os.environ.get("NODE_RANK", "0"), rank=index,
            local_rank=index, role_name="default")
    return LineRelay(prefix)
