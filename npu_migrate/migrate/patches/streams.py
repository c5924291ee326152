"""``torch.cuda`` streams, events and nvtx ranges on the target.

Usage::

    from npu_migrate.migrate.patches import streams

    streams.CPU["event"]             # (HostEvent, "host event: measures time"): torch.cuda.Event on cpu
    streams.install_nvtx()           # torch.cuda.nvtx.*: torch.npu.mstx markers on npu, else no-ops

:mod:`.cuda_namespace` patches the rows of :mod:`npu_migrate.cuda_api` whose ``cpu`` names an
answer of :data:`CPU` with the rest of ``torch.cuda``; on npu it uses ``torch.npu``'s function of
the same name instead. The stand-ins keep what the CUDA classes offer (``Event(enable_timing=True).enable_timing``,
``Stream.priority``, ``query()``, ``wait_event``...), and a user's subclass of ``torch.cuda.Event``
or ``Stream`` constructs that subclass (:class:`npu_migrate.migrate.callers.SwitchMeta`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Callable, Iterator

import torch

from npu_migrate import cuda_api
from npu_migrate import device as _device
from npu_migrate.migrate.callers import caller_aware
from npu_migrate.migrate.signatures import answer
from npu_migrate.migrate.state import STATE, patch

HOST_STREAM = _device.HostStream()



def stream(stream: Any) -> Any:
    """``torch.cuda.stream(stream)`` on the CPU target (timm passes it by keyword: ``stream=s``)."""
    return contextlib.nullcontext(stream)


def stream_context(stream: Any) -> Any:
    """``torch.cuda.StreamContext(stream)`` on the CPU target."""
    return contextlib.nullcontext(stream)


# The cpu answers of torch.cuda's streams and events, by the names their rows in
# npu_migrate.cuda_api give them (``cpu``), as (implementation, report note).
CPU: dict[str, tuple[Callable[..., Any], str]] = {
    "host_stream": (answer(lambda: HOST_STREAM), "host stream"),
    "stream": (stream, ""),
    "stream_context": (stream_context, ""),
    "event": (_device.HostEvent, "host event: measures time"),
    "stream_class": (_device.HostStream, "host stream"),
}
# torch.cuda.nvtx ranges annotate profiles. On npu they become torch.npu.mstx markers (the Ascend
# profiler's, torch_npu.npu.mstx) where torch_npu has them; elsewhere, no-ops that take the same
# arguments and return what CUDA's do (a nesting depth, a range id).
# Which names: the nvtx rows of npu_migrate.cuda_api.
NVTX = tuple(name.partition(".")[2] for name in cuda_api.CUDA_API if name.startswith("nvtx."))


class _Ranges(threading.local):
    """The open ``range_push`` ranges of this thread (NVTX's push/pop stack is per thread)."""

    def __init__(self) -> None:
        self.stack: list[Any] = []


def nvtx_functions(mstx: Any) -> dict[str, Callable[..., Any]]:
    """``torch.cuda.nvtx``'s functions over ``mstx`` (``mark``/``range_start``/``range_end``), or no-ops."""
    ranges = _Ranges()
    ids = itertools.count(1)

    def range_start(msg: str) -> int:
        return mstx.range_start(msg) if mstx is not None else next(ids)

    def range_end(range_id: int) -> None:
        if mstx is not None:
            mstx.range_end(range_id)

    def range_push(msg: str) -> int:
        ranges.stack.append(range_start(msg))
        return len(ranges.stack) - 1  # the zero-based depth of the new range, as NVTX returns

    def range_pop() -> int:
        if not ranges.stack:
            return -1  # NVTX's answer for a pop without a push
        range_end(ranges.stack.pop())
        return len(ranges.stack)

    def mark(msg: str) -> None:
        if mstx is not None:
            mstx.mark(msg)

    @contextlib.contextmanager
    def range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:  # noqa: A001 - torch.cuda.nvtx.range
        range_push(msg.format(*args, **kwargs))
        try:
            yield
        finally:
            range_pop()

    return {"range_push": range_push, "range_pop": range_pop, "range_start": range_start,
            "range_end": range_end, "mark": mark, "range": range}


def install_nvtx() -> None:
    """``torch.cuda.nvtx.*`` for user code: ``torch.npu.mstx`` markers on npu where present, else no-ops."""
    spec = STATE.require_target("install_nvtx()")
    npu = getattr(torch, spec.name, None) if spec.is_accelerator else None
    mstx = getattr(npu, "mstx", None)
    where = f"torch.{spec.name}.mstx" if mstx is not None else "profiling annotation"
    functions = nvtx_functions(mstx)
    nvtx = torch.cuda.nvtx
    for name in NVTX:
        if hasattr(nvtx, name):
            patch(nvtx, name, caller_aware(getattr(nvtx, name), functions[name], f"torch.cuda.nvtx.{name}",
                                           "redirected" if mstx is not None else "noop", where))
