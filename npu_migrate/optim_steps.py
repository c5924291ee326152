"""Seeing every optimizer step on every torch release, whatever ``torch.compile`` did to torch's step hooks.

Usage::

    from npu_migrate import optim_steps

    steps = optim_steps.watch(before=lambda opt, args, kwargs: ..., after=lambda opt, args, kwargs: ...)
    train()                   # steps.stepping(): inside an optimizer step, in this thread
    steps.undo()

**Why not torch's own hooks.** ``register_optimizer_step_pre_hook`` and its kin run inside the
profiling wrapper that ``Optimizer.__init__`` puts around its class's ``step``. On torch 2.1 the
first ``torch.compile`` in a process (dynamo's ``TorchPatcher.patch``) takes that wrapper off every
``torch.optim`` class and marks ``step`` as wrapped so it never comes back: from then on no global
or per-optimizer step hook fires in the process, silently. A script that compiles its model (or a
test run earlier in the same process that did) would be recorded with no step at all.

**What this does instead.** Every ``Optimizer`` subclass that defines ``step`` gets it wrapped: those
that exist at :func:`watch`, and those defined later (an ``__init_subclass__`` on ``Optimizer``:
optimizers of libraries the script imports afterwards, the script's own). A class that inherits
``step`` is served by its ancestor's wrapper. The callbacks run around the *outermost* step call of
a thread only (a subclass whose ``step`` calls its base's is one step). The wrapper sets no
``__wrapped__`` (dynamo 2.1 would unwrap it) and keeps the wrapped function's ``hooked`` mark (so
``Optimizer.__init__`` does not put a second profiling wrapper around it, which would run the
user's own step hooks twice). ``after`` runs only when the step returned; what it raises reaches the
caller of ``step``.

**Undo.** :meth:`StepWatch.undo` puts back every class's ``step`` still ours; one that torch wrapped
again meanwhile (its profiling wrapper around ours) keeps ours inside, which calls straight through
from then on.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

import torch

StepCallback = Callable[[torch.optim.Optimizer, tuple, dict], None]
"""``(optimizer, args, kwargs)`` of the step call, as torch's own step hooks are called."""

_KEPT = ("__name__", "__qualname__", "__doc__", "__module__", "hooked")
"""The wrapped ``step``'s attributes the wrapper carries too (never ``__wrapped__``)."""


class StepWatch:
    """The callbacks of one :func:`watch` and the classes whose ``step`` it wrapped."""

    def __init__(self, before: StepCallback | None, after: StepCallback | None) -> None:
        self.before, self.after = before, after
        self.active = True
        self.local = threading.local()
        self.replaced: dict[type, Any] = {}  # class -> its own ``step`` before we wrapped it
        self._init_subclass: Any = None      # ours, on Optimizer
        self._previous: Any = None           # Optimizer's own __init_subclass__ before ours, if it had one

    def stepping(self) -> bool:
        """This thread is inside an optimizer step (between ``before`` and the step's return)."""
        return bool(getattr(self.local, "inside", False))

    def undo(self) -> None:
        """Stop calling the callbacks; put back every ``step`` still ours (see the module docstring)."""
        self.active = False
        base = torch.optim.Optimizer
        if base.__dict__.get("__init_subclass__") is self._init_subclass:
            if self._previous is not None:
                base.__init_subclass__ = self._previous  # type: ignore[assignment]
            else:
                del base.__init_subclass__
        for cls, own in self.replaced.items():
            if getattr(cls.__dict__.get("step"), "_npu_migrate_watch", None) is self:
                cls.step = own  # type: ignore[attr-defined]
        self.replaced.clear()

    remove = undo
    """As torch's hook handles are removed."""

    def _install(self) -> None:
        base = torch.optim.Optimizer
        for cls in _subclasses(base):
            self._wrap(cls)
        previous = self._previous = base.__dict__.get("__init_subclass__")
        watch = self

        def init_subclass(cls: type, **kwargs: Any) -> None:
            if previous is not None:
                previous.__get__(None, cls)(**kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            if watch.active:
                watch._wrap(cls)

        self._init_subclass = classmethod(init_subclass)
        base.__init_subclass__ = self._init_subclass  # type: ignore[assignment]

    def _wrap(self, cls: type) -> None:
        own = cls.__dict__.get("step")
        if own is None or cls in self.replaced or getattr(own, "_npu_migrate_watch", None) is self:
            return
        self.replaced[cls] = own
        cls.step = self._wrapped(own)  # type: ignore[attr-defined]

    def _wrapped(self, step: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def step_watched(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            local = watch.local
            if not watch.active or getattr(local, "inside", False):
                return step(optimizer, *args, **kwargs)
            local.inside = True
            try:
                if watch.before is not None:
                    watch.before(optimizer, args, kwargs)
                result = step(optimizer, *args, **kwargs)
            finally:
                local.inside = False
            if watch.after is not None:
                watch.after(optimizer, args, kwargs)
            return result

        for name in _KEPT:
            if hasattr(step, name):
                setattr(step_watched, name, getattr(step, name))
        try:
            step_watched.__signature__ = inspect.signature(step)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        step_watched._npu_migrate_watch = self  # type: ignore[attr-defined]
        return step_watched


def _subclasses(base: type) -> list[type]:
    found: list[type] = []
    todo = [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return found


def watch(before: StepCallback | None = None, after: StepCallback | None = None) -> StepWatch:
    """Call ``before``/``after`` around every optimizer step from now on, until ``.undo()``."""
    state = StepWatch(before, after)
    state._install()
    return state
