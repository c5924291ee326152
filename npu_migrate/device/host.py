"""Events and streams of the chosen family, with CPU stand-ins: ``torch.cuda.Event``'s timing on any host.

Usage::

    import npu_migrate as nm

    start, end = nm.Event(enable_timing=True), nm.Event(enable_timing=True)
    start.record(); work(); end.record(); nm.synchronize()
    start.elapsed_time(end)              # milliseconds, on CPU too (HostEvent)
    with nm.stream(nm.Stream()):
        ...

On an accelerator these are the family's own (``torch.npu.Event``...). On CPU, where work is
synchronous, :class:`HostEvent` marks the moment it is recorded and :class:`HostStream` waits for nothing.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from npu_migrate.device.calls import _module
from npu_migrate.device.selection import device_spec


class HostEvent:
    """An event for the CPU family that measures time, where ``torch.cpu.Event`` does not.

    Work on CPU is synchronous, so ``record()`` marks the moment it is called.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.interprocess = interprocess
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        self._time = time.perf_counter()

    def elapsed_time(self, end_event: HostEvent) -> float:
        """Milliseconds between this event and ``end_event``, as ``torch.cuda.Event`` reports."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True to measure time.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before elapsed_time() is called.")
        return (end_event._time - self._time) * 1000.0

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass


class HostStream:
    """A stream for the CPU family: work is already in order, so every wait is immediate."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cpu")
        self.priority = priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """``(lowest, highest)`` priority, as ``torch.cuda.Stream.priority_range()``: one level on CPU."""
        return (0, 0)

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: HostEvent | None = None) -> HostEvent:
        event = event or HostEvent()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostStream)

    def __hash__(self) -> int:
        return hash(HostStream)


def Event(enable_timing: bool = False, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.Event
    """Return the family's event class instance, like ``torch.cuda.Event(enable_timing=True)``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return HostEvent(enable_timing=enable_timing, **kwargs)
    return _module(spec).Event(enable_timing=enable_timing, **kwargs)


def Stream(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.Stream
    """Return a new stream of the family, like ``torch.cuda.Stream()``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return HostStream(*args, **kwargs)
    return _module(spec).Stream(*args, **kwargs)


_HOST_STREAM = HostStream()


def current_stream(index: int | None = None) -> Any:
    """Return the current stream of a device, like ``torch.cuda.current_stream()``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return _HOST_STREAM
    return _module(spec).current_stream(index)


def stream(s: Any) -> AbstractContextManager[Any]:
    """Return a context that makes ``s`` current, like ``torch.cuda.stream(s)``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return nullcontext(s)
    return _module(spec).stream(s)
