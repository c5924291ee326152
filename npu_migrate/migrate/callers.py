"""Caller classification: is the code asking a question the user's, or torch's and the libraries'?

Usage::

    from npu_migrate.migrate import callers

    callers.reset()                                   # at install: recompute the roots (see usercode)
    callers.is_internal(frame.f_code.co_filename)     # True for torch, stdlib, site-packages, npu_migrate
    callers.internal_frame(sys._getframe(1))          # the same for a frame; generated code: who ran it
    callers.record("Tensor.cuda")                     # counted in the report, with the user's call site
    callers.library_questions()                       # library code that asked CUDA and got torch's answer
    wrapped = callers.caller_aware(torch.cuda.is_available, lambda: True, "torch.cuda.is_available", "redirected")

Queries such as ``torch.cuda.is_available()`` answer for the target device when the caller is
user code, and give torch's own answer to library code, so optimizers, DataLoader and libraries
never take CUDA-only paths on a machine without CUDA. Which files are whose is decided by
:mod:`npu_migrate.migrate.usercode` (the longest root containing the file wins; ``--user-code``
names more). Generated code (``<string>`` from ``exec``, FX's ``<eval_with_key>``) has no file:
it takes the classification of the nearest frame with one, the code that ran it.
:func:`caller_aware` and :func:`switch_class` build the two-faced functions and classes; a class
derived from a stand-in (``class Timer(torch.cuda.Event)``) is built on what its defining code
would construct.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from typing import Any, Callable

from npu_migrate.migrate import usercode
from npu_migrate.migrate.report import REPORT

_CLASSIFIED: dict[str, bool | None] = {}  # file -> internal; None: generated code, ask who ran it
_UNSEEN = object()
_ROOTS: list[list[usercode.Root]] = [[]]
_LEFT_ALONE: dict[str, int] = {}  # api -> calls from library code that got torch's own answer
_ASKED: dict[str, str] = {}  # file of library code -> the last CUDA API it called and got torch's answer for
_TOLD_NO_CUDA: dict[int, Any] = {}  # id -> code object of library code that torch told "no CUDA" (kept: ids stay)

NO_CUDA_QUESTIONS = frozenset(f"torch.{namespace}.{question}" for namespace in ("cuda", "accelerator")
                              for question in ("is_available", "device_count"))
"""The questions whose answer ``False`` or ``0`` tells the asking code that there is no CUDA."""


def internal_prefixes() -> tuple[str, ...]:
    """Folders whose code is internal: torch, npu_migrate, the standard library, site-packages."""
    return tuple(os.path.join(r.path, "") for r in usercode.internal_roots())


def reset() -> None:
    """Recompute the roots and forget every classified file (called by ``install``).

    Raises:
        UsageError: ``--user-code``/``NPU_MIGRATE_USER_CODE`` names something that does not exist.
    """
    user = usercode.resolve()
    _ROOTS[0] = usercode.internal_roots() + user
    _CLASSIFIED.clear()
    _LEFT_ALONE.clear()
    _ASKED.clear()
    _TOLD_NO_CUDA.clear()
    REPORT.user_code = [{"path": r.path, "source": r.source, "name": r.name} for r in user]
    REPORT.left_alone = _LEFT_ALONE


def _classify(filename: str) -> bool | None:
    if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
        return True
    if filename.startswith("<"):  # <string>, <eval_with_key>.3, <stdin>: whoever ran it
        return None
    root = usercode.classify(os.path.realpath(filename), _ROOTS[0])
    return root is not None and not root.user


def is_internal(filename: str) -> bool:
    """True for code whose questions about CUDA must get torch's true answer (generated code: False)."""
    known = _CLASSIFIED.get(filename, _UNSEEN)
    if known is _UNSEEN:
        known = _CLASSIFIED[filename] = _classify(filename)
    return bool(known)


# torch.compile evaluates the user's calls (torch.cuda.is_available(), x.is_cuda) inside
# dynamo's own frames; the question belongs to the code being traced.
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


def internal_frame(frame: Any) -> bool:
    """Whether the code running in ``frame`` is internal.

    Generated code asks the nearest frame with a file (the code that ran it); dynamo's frames ask
    the code they are tracing.
    """
    while frame is not None:
        filename = frame.f_code.co_filename
        known = _CLASSIFIED.get(filename, _UNSEEN)
        if known is _UNSEEN:
            known = _CLASSIFIED[filename] = _classify(filename)
        if known is None:
            frame = frame.f_back
            continue
        if known and _DYNAMO in filename:
            traced = traced_filename(frame)
            if traced is not None:
                return is_internal(traced)
        return known
    return False  # generated code run from nowhere with a file: an interactive session


is_internal_caller = internal_frame  # the name the compile patches use


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


def left_alone(api: str) -> None:
    """Count one call of ``api`` from library code, which got torch's own answer.

    Called by a stand-in: the stand-in's caller (two frames up) is noted as a library file that
    asked, for :func:`library_questions`.
    """
    _LEFT_ALONE[api] = _LEFT_ALONE.get(api, 0) + 1
    _ASKED[sys._getframe(2).f_code.co_filename] = api


def library_questions() -> tuple[dict[str, str], set[Any]]:
    """What library code asked CUDA in this process and got torch's own answer to.

    Returns:
        ``{file: the last API it called}``, and the code objects of the functions torch told there
        is no CUDA (:data:`NO_CUDA_QUESTIONS` answered ``False`` or ``0``), for
        :mod:`npu_migrate.migrate.libraries.library_failure`.
    """
    return dict(_ASKED), set(_TOLD_NO_CUDA.values())


def caller_aware(original: Callable[..., Any], replacement: Callable[..., Any], api: str, kind: str,
                 detail: str = "") -> Callable[..., Any]:
    """Torch and libraries get ``original``; user code gets ``replacement`` (and is counted)."""
    question = api in NO_CUDA_QUESTIONS
    # An answer that ignores its arguments (signatures.shaped), called bare by user code, skips the
    # shaped wrapper's frame: torch.cuda.synchronize() on the cpu target, every step (410 -> 330 ns a
    # call in a loop of its own).
    bare = getattr(replacement, "__npu_migrate_bare__", None)

    def call(*args: Any, **kwargs: Any) -> Any:
        frame = sys._getframe(1)
        # The hot path, torch.cuda.synchronize() in a user's step: a file already known to be the
        # user's, counted in place (what internal_frame() and record() do, without the calls).
        entry = REPORT.entries.get(api) if _CLASSIFIED.get(frame.f_code.co_filename) is False else None
        if entry is not None:
            entry["count"] += 1
        elif internal_frame(frame):
            left_alone(api)
            answer = original(*args, **kwargs)
            if question and not answer:  # the answer is the library's, unchanged; only noted
                code = sys._getframe(1).f_code
                _TOLD_NO_CUDA[id(code)] = code  # by id: a code object's hash is computed each time
            return answer
        else:
            record(api, kind, detail)
        if bare is not None and not args and not kwargs:
            return bare()
        return replacement(*args, **kwargs)

    functools.update_wrapper(call, original)
    call.__wrapped_by_npu_migrate__ = True  # type: ignore[attr-defined]
    call.__npu_migrate_impl__ = replacement  # type: ignore[attr-defined] # what user code runs (signatures.py)
    call.__npu_migrate_api__ = api  # type: ignore[attr-defined]
    return call


class SwitchMeta(type):
    """A class stand-in: user code constructs ``_impl``, torch constructs ``_orig``; isinstance sees both.

    Class attributes (``torch.cuda.Stream.priority_range``, unbound methods) come from ``_impl``
    where it has them, else from ``_orig``. A class derived from a stand-in is built on ``_impl``
    when user code defines it and on ``_orig`` when a library does, so ``Timer(...)`` constructs
    a ``Timer``.
    """

    def __new__(mcs, name: str, bases: tuple, namespace: dict, **kwargs: Any) -> Any:
        if "_orig" in namespace:  # the stand-in itself (switch_class)
            return super().__new__(mcs, name, bases, namespace, **kwargs)
        internal = internal_frame(sys._getframe(1))
        resolved = []
        for base in bases:
            if isinstance(base, SwitchMeta):
                impl = type.__getattribute__(base, "_impl")
                base = type.__getattribute__(base, "_orig") if internal or not isinstance(impl, type) else impl
            resolved.append(base)
        body = {k: v for k, v in namespace.items() if k != "__qualname__"}
        cls = types.new_class(name, tuple(resolved), kwargs, lambda ns: ns.update(body))
        cls.__qualname__ = namespace.get("__qualname__", name)
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if internal_frame(sys._getframe(1)):
            left_alone(cls._api)
            return cls._orig(*args, **kwargs)
        record(cls._api, cls._kind, cls._detail)
        return cls._make(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        impl = type.__getattribute__(cls, "_impl")
        if hasattr(impl, name):
            return getattr(impl, name)
        return getattr(type.__getattribute__(cls, "_orig"), name)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._types)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._types)


def switch_class(original: type, impl: Callable[..., Any], api: str, kind: str, detail: str = "",
                 make: Callable[..., Any] | None = None) -> type:
    """A stand-in for class ``original``: user code gets ``impl(...)``, internal code ``original(...)``.

    ``make``, where given, constructs for user code instead of ``impl`` (``impl`` still answers
    isinstance, class attributes and subclassing): ``impl`` called with the arguments its
    signature takes (:mod:`npu_migrate.migrate.fit`).
    """
    types_ = tuple(t for t in (original, impl) if isinstance(t, type))
    return SwitchMeta(original.__name__, (), {
        "_orig": original, "_impl": impl, "_make": make or impl, "_api": api, "_kind": kind, "_detail": detail,
        "_types": types_, "__doc__": original.__doc__, "__module__": original.__module__,
    })
