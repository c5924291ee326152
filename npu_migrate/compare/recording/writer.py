"""Appending a probe's records to its rank file: in order, whole lines, inline or from a writer thread.

Usage::

    writer = RecordWriter(fh, threaded=True)      # fh: a binary file opened for appending
    writer.put({"kind": "header", ...})            # a ready record
    writer.put(lambda: [{"kind": "step", ...}])    # a job: run where the file is written, returns records
    writer.close()                                 # every record written, the thread joined, fh closed

A job is how a record built from device tensors reaches the file without the training thread
waiting for the device: the probe hands over the tensors and an event recorded after the work
that made them (:class:`DeviceFence`); the job waits for the event, copies the values to the host
and builds the records. Inline (CPU tensors, where nothing is waited for), each record is on disk
when :meth:`RecordWriter.put` returns, so a crash keeps every finished step. From the thread
(accelerators), at most :data:`MAX_PENDING` steps are in flight: ``put`` waits when more are, and
a process killed outright may lose those; :meth:`RecordWriter.close` (at exit, from ``atexit`` and
multiprocessing's finalizers) writes everything pending first.

A failure to write (a full disk) is raised again in the training thread at the next ``put`` or at
``close``: the thread never drops records silently.
"""

from __future__ import annotations

import json
import queue
import threading
from typing import Any, Callable, Union

from npu_migrate import redact

Job = Union[dict, Callable[[], list]]

# Steps whose records may wait for the writer thread. Two lets the device finish one step while
# the next is queued; more would only hold more device tensors and lose more to a SIGKILL.
MAX_PENDING = 2
_STOP = object()


def encode(record: dict[str, Any]) -> bytes:
    """One record as its line: compact JSON; a header through :func:`npu_migrate.redact.value`."""
    if record.get("kind") == "header":
        record = redact.value(record)  # recordings are copied between machines: no secrets in them
    return (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8")


class DeviceFence:
    """An event recorded on the current stream of an accelerator: ``wait()`` returns once the work
    queued before it is done, from any thread. ``None`` from :meth:`create` where the device type
    has no event API (the CPU): then nothing needs waiting for.
    """

    def __init__(self, event: Any) -> None:
        self._event = event

    @classmethod
    def create(cls, device_type: str) -> DeviceFence | None:
        if device_type == "cpu":
            return None
        import torch

        event_type = getattr(getattr(torch, device_type, None), "Event", None)  # torch.cuda.Event, torch.npu.Event
        if event_type is None:
            return None
        try:
            event = event_type()
            event.record()
        except Exception:  # noqa: BLE001 - an extension without working events: write inline
            return None
        return cls(event)

    def wait(self) -> None:
        self._event.synchronize()


class RecordWriter:
    """Writes records to ``fh`` in the order they were put; see the module docstring."""

    def __init__(self, fh: Any, *, threaded: bool) -> None:
        self._fh = fh
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        if threaded:
            self._queue = queue.Queue(maxsize=MAX_PENDING)
            # A daemon: the interpreter joins other threads before atexit runs close(), which joins this one.
            self._thread = threading.Thread(target=self._run, name="npu_migrate-probe-writer", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def put(self, job: Job) -> None:
        """Write ``job`` (a record, or a callable returning records) now or on the thread.

        Raises:
            OSError: an earlier write on the thread failed (raised once, then writing resumes).
        """
        self._raise_pending()
        if self._queue is None:
            self._write(job)
        else:
            self._queue.put(job)

    def close(self) -> None:
        """Write everything pending, stop the thread and close the file."""
        try:
            if self._thread is not None and self._queue is not None:
                self._queue.put(_STOP)
                self._thread.join()
                self._thread = None
            self._raise_pending()
        finally:
            self._fh.close()

    def _raise_pending(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write(self, job: Job) -> None:
        records = job() if callable(job) else [job]
        self._fh.write(b"".join(encode(r) for r in records))
        self._fh.flush()

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            try:
                self._write(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                if self._error is None:
                    self._error = exc
