"""A script that stopped at an installed library's CUDA check: which package, and the ``--user-code`` that fixes it.

Usage::

    library_failure.hint(exc)   # "the CUDA call is in timm (installed), which gets torch's own answers:
                                #  add --user-code timm to migrate its calls too", or None
    library_failure.decide(frames, AssertionError, message, asked={"timm"})   # the decision alone: "timm"

Only the user's code gets the migrated answers (:mod:`npu_migrate.migrate.callers`): an installed library that asks
``torch.cuda.is_available()`` gets torch's own ``False``, and may end the job with its own check
(timm's ``init_distributed_device``: "CUDA is not available but cuda was specified."). Runtime
migration registers :func:`hint` with :mod:`npu_migrate.failure_hints` at install, so ``npu-migrate
run`` and the launcher's failure summary add the line.

A failure is such a check when, in its traceback (or the one of the exception it was raised from),

* the innermost frame below torch, its device extension, the standard library, npu_migrate and
  generated code is in an installed package (a library by migration's rule, :mod:`npu_migrate.migrate.usercode`:
  site-packages; ``--user-code`` makes it the user's);
* that package asked CUDA through migration's stand-ins in this process and got torch's answer
  (:func:`npu_migrate.migrate.callers.library_questions`), so ``--user-code`` would change the answer it gets;
* and the error says CUDA is missing (:data:`CUDA_MISSING`: torch's own words, or "CUDA is not
  available"), or it is an ``AssertionError``/``RuntimeError`` raised in the very function that torch
  told there is no CUDA (``is_available()`` was ``False``, ``device_count()`` 0).

Messages alone would also name a package whose CUDA calls bypass the stand-ins, where
``--user-code`` changes nothing; the record is what says the flag helps.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from npu_migrate.migrate import callers, usercode
from npu_migrate.registry import DEVICES

CUDA_MISSING = re.compile("|".join((
    r"Torch not compiled with CUDA enabled",
    r"Found no NVIDIA driver",
    r"No CUDA GPUs are available",
    r"no CUDA-capable device is detected",
    r"CUDA driver version is insufficient",
    r"\b(CUDA|GPUs?)\b[^.\n]{0,30}\bnot (available|found|detected)",  # "CUDA is not available", "GPU not found"
)), re.IGNORECASE)
"""Errors that say there is no CUDA: torch's (a CPU build, no driver, no device), and libraries' own wording."""

CHECK_ERRORS = (AssertionError, RuntimeError)
"""What a library's own check raises right after torch told it there is no CUDA (``assert``, ``raise``)."""

CHAIN_LIMIT = 8
"""Exceptions looked at along ``__cause__``/``__context__`` (a library's error raised from torch's)."""


@dataclass(frozen=True)
class Frame:
    """One frame of a traceback, as :func:`decide` sees it.

    Attributes:
        package: the installed package its code is in; None for the user's code and for ``infra``.
        infra: torch, its device extension, the standard library, npu_migrate, generated code:
            what the failure passes through on its way to whoever called it.
        told_no_cuda: its function asked :data:`~npu_migrate.migrate.callers.NO_CUDA_QUESTIONS` and torch said no CUDA.
    """

    package: str | None = None
    infra: bool = False
    told_no_cuda: bool = False


def decide(frames: Sequence[Frame], exc_type: type, message: str, asked: Iterable[str]) -> str | None:
    """The installed package whose CUDA check raised, or None (see the module's docstring).

    Args:
        frames: the traceback's frames, the outermost first.
        exc_type: the exception's class; ``message`` its text.
        asked: the packages that asked CUDA through migration's stand-ins and got torch's answer.
    """
    own = [f for f in frames if not f.infra]
    if not own or own[-1].package is None or own[-1].package not in set(asked):
        return None
    innermost = own[-1]
    if CUDA_MISSING.search(message):
        return innermost.package
    raised_there = frames[-1] is innermost  # the raise itself is in the package's frame, not in torch below it
    if raised_there and innermost.told_no_cuda and issubclass(exc_type, CHECK_ERRORS):
        return innermost.package
    return None


@dataclass(frozen=True)
class _Place:
    """Where a file is: the user's, infra, or an installed package (its name and folder or file)."""

    infra: bool = False
    package: str | None = None
    location: str = ""


class _Places:
    """Classifies files as :class:`_Place` (cached for one failure)."""

    def __init__(self) -> None:
        self.libraries = usercode.internal_roots()
        torch = sys.modules.get("torch")
        paths = sysconfig.get_paths()
        infra = [os.path.dirname(os.path.dirname(os.path.abspath(usercode.__file__))),  # npu_migrate
                 paths.get("stdlib", ""), paths.get("platstdlib", "")]
        if torch is not None and getattr(torch, "__file__", None):
            infra.append(os.path.dirname(os.path.abspath(torch.__file__)))
        self.infra_roots = {os.path.realpath(p) for p in infra if p}
        self.infra_packages = {"torch", *(s.extension for s in DEVICES.values() if s.extension)}
        self.cache: dict[str, _Place] = {}

    def of(self, filename: str) -> _Place:
        place = self.cache.get(filename)
        if place is None:
            place = self.cache[filename] = self._place(filename)
        return place

    def _place(self, filename: str) -> _Place:
        if filename.startswith("<"):  # <frozen ...>, <string>: passed through
            return _Place(infra=True)
        if not callers.is_internal(filename):  # the user's, by the roots migration was installed with
            return _Place()
        path = os.path.realpath(filename)
        root = usercode.classify(path, self.libraries)
        if root is None or root.path in self.infra_roots:
            return _Place(infra=True)
        top = os.path.relpath(path, root.path).split(os.sep)[0]
        name = top[:-3] if top.endswith(".py") else top
        if name in self.infra_packages:
            return _Place(infra=True)
        return _Place(package=name, location=os.path.join(root.path, top))


def _frames(exc: BaseException, places: _Places, told: set[Any]) -> list[Frame]:
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        place = places.of(code.co_filename)
        frames.append(Frame(place.package, place.infra, code in told))
        tb = tb.tb_next
    return frames


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """``exc``, then what it was raised from or during, as far as :data:`CHAIN_LIMIT`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < CHAIN_LIMIT:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def user_code_argument(name: str, location: str) -> str:
    """What to give ``--user-code`` for the package ``name`` at ``location``: the name where it finds
    that very package (:mod:`npu_migrate.migrate.usercode`), else the folder."""
    found = usercode._locate(name) if name.isidentifier() else None  # the flag's own lookup
    return name if found is not None and found[0] == os.path.realpath(location) else shlex.quote(location)


def hint(exc: BaseException) -> str | None:
    """The line naming the installed package whose CUDA check ended the script, and the fix; or None."""
    asked_files, told = callers.library_questions()
    if not asked_files:
        return None
    places = _Places()
    asked = {places.of(f).package for f in asked_files} - {None}
    for failure in _chain(exc):
        package = decide(_frames(failure, places, told), type(failure), str(failure), asked)
        if package is not None:
            location = next(p.location for p in places.cache.values() if p.package == package)
            argument = user_code_argument(package, location)
            return (f"the CUDA call is in {package} (installed), which gets torch's own answers: "
                    f"add --user-code {argument} to migrate its calls too")
    return None
