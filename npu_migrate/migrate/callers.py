"""Caller classification: is the code asking a question the user's, or torch's and the libraries'?

Usage::

    from npu_migrate.migrate import callers

    callers.reset()                                   # at install: recompute what is internal
    callers.is_internal(frame.f_code.co_filename)     # True for torch, stdlib, site-packages, npu_migrate
    callers.record("Tensor.cuda")                     # counted in the report, with the user's call site
    wrapped = callers.caller_aware(torch.cuda.is_available, lambda: True, "torch.cuda.is_available", "redirected")

Queries such as ``torch.cuda.is_available()`` answer for the target device when the caller is
user code, and give torch's own answer to code in torch, the standard library, site-packages and
npu_migrate, so optimizers, DataLoader and libraries never take CUDA-only paths on a machine without
CUDA. :func:`caller_aware` and :func:`switch_class` build those two-faced functions and classes.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from typing import Any, Callable

from npu_migrate.migrate.report import REPORT

_CLASSIFIED: dict[str, bool] = {}
_PREFIXES: list[tuple[str, ...]] = [()]


def internal_prefixes() -> tuple[str, ...]:
    """Directories whose code is internal: torch, npu_migrate, the standard library, site-packages."""
    import torch

    paths = sysconfig.get_paths()
    prefixes = {
        os.path.dirname(os.path.abspath(torch.__file__)),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # npu_migrate
        *(paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    try:
        import site

        prefixes.update(site.getsitepackages())
        prefixes.add(site.getusersitepackages())
    except (AttributeError, ImportError):
        pass
    return tuple(sorted(os.path.join(os.path.realpath(p), "") for p in prefixes if p))


def reset() -> None:
    """Recompute the internal prefixes and forget every classified file (called by ``install``)."""
    _PREFIXES[0] = internal_prefixes()
    _CLASSIFIED.clear()


def is_internal(filename: str) -> bool:
    """True for code whose questions about CUDA must get torch's true answer."""
    known = _CLASSIFIED.get(filename)
    if known is None:
        if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
            known = True
        elif filename.startswith("<"):  # <string>, <stdin>: the user's own code
            known = False
        else:
            known = os.path.realpath(filename).startswith(_PREFIXES[0])
        _CLASSIFIED[filename] = known
    return known


# torch.compile evaluates the user's calls (torch.cuda.is_available(), x.is_cuda) inside
# dynamo's own frames; the question belongs to the code being traced (see is_internal_caller).
_DYNAMO = os.path.join("torch", "_dynamo", "")


def traced_filename(frame: Any) -> str | None:
    """The file of the code dynamo is tracing when ``frame`` is one of dynamo's, else None."""
    while frame is not None and _DYNAMO in frame.f_code.co_filename:
        local = frame.f_locals
        tx = local.get("tx") or getattr(local.get("self"), "tx", None)  # a translator, or a builder's
        code = getattr(tx, "f_code", None)
        if code is not None:
            return code.co_filename
        frame = frame.f_back
    return None


def is_internal_caller(frame: Any) -> bool:
    """:func:`is_internal` for the code running in ``frame``, or the code dynamo traces there."""
    filename = frame.f_code.co_filename
    known = _CLASSIFIED.get(filename)  # the hot path: one dict lookup for a file already seen
    if known is False or (known is None and not is_internal(filename)):
        return False
    if _DYNAMO in filename:
        traced = traced_filename(frame)
        if traced is not None:
            return is_internal(traced)
    return True


def user_site(depth: int = 2) -> str:
    """``file:line`` of the nearest user frame at or above ``depth`` frames up, or ``"?"``."""
    frame = sys._getframe(depth)
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def record(api: str, kind: str = "redirected", detail: str = "") -> None:
    """Count one call of ``api`` in the report; the first also notes the user's call site."""
    entry = REPORT.entries.get(api)
    if entry is not None:
        entry["count"] += 1
    else:
        REPORT.record(api, kind, user_site(3), detail)


def caller_aware(original: Callable[..., Any], replacement: Callable[..., Any], api: str, kind: str,
                 detail: str = "") -> Callable[..., Any]:
    """Torch and libraries get ``original``; user code gets ``replacement`` (and is counted)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if is_internal_caller(sys._getframe(1)):
            return original(*args, **kwargs)
        record(api, kind, detail)
        return replacement(*args, **kwargs)

    functools.update_wrapper(call, original)
    call.__wrapped_by_npu_migrate__ = True  # type: ignore[attr-defined]
    return call


class SwitchMeta(type):
    """A class stand-in: user code constructs ``_impl``, torch constructs ``_orig``; isinstance sees both."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if is_internal_caller(sys._getframe(1)):
            return cls._orig(*args, **kwargs)
        record(cls._api, cls._kind, cls._detail)
        return cls._impl(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._types)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._types)


def switch_class(original: type, impl: Callable[..., Any], api: str, kind: str, detail: str = "") -> type:
    """A stand-in for class ``original``: user code gets ``impl(...)``, internal code ``original(...)``."""
    types = tuple(t for t in (original, impl) if isinstance(t, type))
    return SwitchMeta(original.__name__, (), {
        "_orig": original, "_impl": impl, "_api": api, "_kind": kind, "_detail": detail,
        "_types": types, "__doc__": original.__doc__, "__module__": original.__module__,
    })
