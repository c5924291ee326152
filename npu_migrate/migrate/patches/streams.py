"""``torch.cuda`` streams, events and nvtx ranges on the target.

Usage::

    from npu_migrate.migrate.patches import streams

    streams.CUDA_CLASSES["Event"]    # ("redirected", HostEvent, "host event: measures time")
    streams.install_nvtx()           # torch.cuda.nvtx.* become profiling no-ops (torch.npu's on npu)

:mod:`.cuda_namespace` patches the names in :data:`CUDA_TABLE` and :data:`CUDA_CLASSES` with the
rest of ``torch.cuda``; on npu it uses ``torch.npu``'s function of the same name instead.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from npu_migrate import device as _device
from npu_migrate.migrate.callers import caller_aware
from npu_migrate.migrate.state import STATE, patch

_HOST_STREAM = _device.HostStream()

# Functions of torch.cuda on the CPU target, as (kind, CPU implementation, note).
CUDA_TABLE: dict[str, tuple[str, Callable[..., Any], str]] = {
    "current_stream": ("redirected", lambda *a, **k: _HOST_STREAM, "host stream"),
    "default_stream": ("redirected", lambda *a, **k: _HOST_STREAM, "host stream"),
    "set_stream": ("noop", lambda *a, **k: None, ""),
    "stream": ("redirected", lambda s=None: contextlib.nullcontext(s), ""),
    "is_current_stream_capturing": ("noop", lambda: False, ""),
}
# Classes of torch.cuda on the CPU target, as (kind, CPU implementation, note).
CUDA_CLASSES: dict[str, tuple[str, Callable[..., Any], str]] = {
    "Event": ("redirected", _device.HostEvent, "host event: measures time"),
    "Stream": ("redirected", _device.HostStream, "host stream"),
    "StreamContext": ("redirected", lambda stream: contextlib.nullcontext(stream), ""),
}
# torch.cuda.nvtx ranges only annotate profiles: harmless no-ops on the target.
NVTX = ("range_push", "range_pop", "range_start", "range_end", "mark", "range")


def install_nvtx() -> None:
    """``torch.cuda.nvtx.*``: no-ops for user code (``torch.npu.nvtx``'s on npu, where it has them)."""
    spec = STATE.target
    assert spec is not None
    npu = getattr(torch, spec.name, None) if spec.is_accelerator else None
    nvtx = torch.cuda.nvtx
    for name in NVTX:
        if hasattr(nvtx, name):
            impl: Any = contextlib.nullcontext if name == "range" else (lambda *a, **k: None)
            if npu is not None and hasattr(getattr(npu, "nvtx", None), name):
                impl = getattr(npu.nvtx, name)
            patch(nvtx, name, caller_aware(getattr(nvtx, name), lambda *a, _i=impl, **k: _i(), f"torch.cuda.nvtx.{name}",
                                           "noop", "profiling annotation"))
