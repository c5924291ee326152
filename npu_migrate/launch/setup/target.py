"""What each worker runs: a script, a module (``-m``), a function, or an executable (``--no-python``).

Usage::

    Target(script="train.py", args=("--epochs", "3"))        # runpy.run_path in each rank
    Target(module="pkg.train")                              # -m: runpy.run_module
    Target(fn=train, args=(opt,))                           # spawn(): fn(local_rank, *args)
    Target(fn=executable.run, args=(path, "-x"), shown="tool -x")   # --no-python (:mod:`..torchrun.executable`)
    target.describe()    # the world table's "target:" line
    target.identity()    # the same on every node: part of the default job id

The worker (:mod:`..procs.worker`) runs it; the launcher's command line makes it (:mod:`..cli`).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Target:
    """What each worker runs: a script, a module (``-m``) or a function ``fn(local_rank, *args)``.

    ``shown``: the command line a function target stands for (``--no-python``'s executable), for
    the world table and the job id.
    """

    script: str | None = None
    module: str | None = None
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    shown: str | None = None

    def describe(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.fn is not None:
            return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}(local_rank, ...)"
        head = ["-m", self.module] if self.module else [self.script or ""]
        return " ".join(shlex.quote(str(a)) for a in [*head, *self.args])

    def identity(self) -> str:
        """What names this job's program the same way on every node (for the default job id)."""
        if self.shown is not None:
            return self.shown
        if self.fn is not None:
            return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"
        head = ["-m", self.module] if self.module else [os.path.basename(self.script or "")]
        return " ".join(map(str, [*head, *self.args]))
