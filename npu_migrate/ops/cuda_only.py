"""CUDA-only code an audited script meets: libraries with CUDA kernels, and CUDA extensions built at run time.

Usage::

    from npu_migrate.ops.cuda_only import Watch

    with Watch() as watch:          # an import hook and a wrapper of cpp_extension.load/load_inline
        run_the_script()
    watch.found                     # [Finding(name="flash_attn", site="train.py:3", advice="...", error="")]

Which libraries count, and the advice for each, is :mod:`npu_migrate.libs.table` (the advice
``npu-migrate port`` gives too). Only imports made by user code count (torch importing Triton for
its own compiler does not). A library that is not installed on the auditing machine is reported all
the same: the import is the finding, and the ``ImportError`` that ends the script is kept with it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

from npu_migrate.libs.table import LIBRARIES, SHIM_NOTE
from npu_migrate.migrate import callers


def advice(name: str) -> str:
    """The advice for one library of :data:`~npu_migrate.libs.table.LIBRARIES`, noting when
    ``npu-migrate run`` serves it (:data:`~npu_migrate.libs.table.SHIM_NOTE`)."""
    library = LIBRARIES[name]
    return library.advice + (SHIM_NOTE if library.served and _findable(library.served) else "")


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


EXTENSION_ADVICE = "a CUDA extension built at run time: port its kernels or replace them with torch operations"


@dataclass
class Finding:
    """One CUDA-only thing the script used.

    Attributes:
        name: the library (``flash_attn``) or ``torch.utils.cpp_extension.load``.
        site: ``file:line`` of the user code that imported or built it.
        advice: what to do instead.
        error: the import or build error, if it failed here.
    """

    name: str
    site: str
    advice: str
    error: str = ""


def _user_site() -> str | None:
    """The nearest user frame, or None when library code (or the import machinery alone) is importing."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen") or
                                 "importlib" in frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or callers.is_internal(frame.f_code.co_filename):
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Watch(importlib.abc.MetaPathFinder):
    """Notes imports of :data:`~npu_migrate.libs.table.LIBRARIES`' libraries by user code, and run-time
    CUDA extension builds."""

    def __init__(self) -> None:
        self.found: list[Finding] = []
        self._seen: set[str] = set()
        self._undo: list[Any] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        for name in LIBRARIES:
            if (fullname == name or fullname.startswith(name + ".")) and name not in self._seen:
                site = _user_site()
                if site is not None:
                    self._seen.add(name)
                    self.found.append(Finding(name, site, advice(name)))
        return None  # never serves the import: the finders after this one do

    def failed(self, exc: BaseException) -> None:
        """Attach the ImportError that ended the script to the library it names."""
        missing = getattr(exc, "name", None) or ""
        for finding in self.found:
            if missing == finding.name or missing.startswith(finding.name + "."):
                finding.error = f"{type(exc).__name__}: {exc}"

    def _wrap_builds(self) -> None:
        import logging

        # Importing it warns "No CUDA runtime is found" on a machine without CUDA: not the user's news.
        quiet = logging.getLogger("torch.utils.cpp_extension")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            from torch.utils import cpp_extension
        finally:
            quiet.setLevel(level)

        for name in ("load", "load_inline"):
            original = getattr(cpp_extension, name)

            def build(*args: Any, __original: Any = original, __name: str = name, **kwargs: Any) -> Any:
                finding = Finding(f"torch.utils.cpp_extension.{__name}", _user_site() or "?", EXTENSION_ADVICE)
                self.found.append(finding)
                try:
                    return __original(*args, **kwargs)
                except Exception as exc:
                    finding.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    raise

            setattr(cpp_extension, name, build)
            self._undo.append(lambda n=name, o=original: setattr(cpp_extension, n, o))

    def __enter__(self) -> "Watch":
        sys.meta_path.insert(0, self)
        self._wrap_builds()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        while self._undo:
            self._undo.pop()()
