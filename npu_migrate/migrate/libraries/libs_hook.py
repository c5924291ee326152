"""Serves flash_attn, xformers and apex from :mod:`npu_migrate.libs` under runtime migration.

Usage::

    from npu_migrate.migrate.libraries import libs_hook

    libs_hook.register()        # install() and the start-up hook call this; torch-free

One finder on ``sys.meta_path`` answers for the libraries' own module names (:data:`SERVED`, read from
the CUDA-only libraries' table, :data:`npu_migrate.libs.table.MODULES`). It
serves npu_migrate's implementation when migration is on and either the target is not CUDA (the
CUDA kernels cannot run there, even if the package is installed) or the package is not installed at
all; otherwise it steps aside and the real package imports. While migration is off (after
``uninstall()``) it does nothing. A submodule of a served package that npu_migrate does not provide
(``flash_attn.layers.rotary``) is a ``ModuleNotFoundError`` naming what is provided, so code that
falls back on ``ImportError`` still does.

The served modules hand out their names lazily: the first use of each (``from flash_attn import
flash_attn_func``) is recorded in the migrate report with the user's call site. In a process
started by a migrated job the script may import flash_attn before torch: the finder then imports
torch first, which arms the migration (:mod:`npu_migrate.migrate.hook`), and decides after.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any, Sequence

from npu_migrate.libs.table import MODULES
from npu_migrate.migrate.environment import ENV_MIGRATE

SERVED: dict[str, str] = MODULES  # module name -> npu_migrate module ("" = a package of submodules)
ROOTS = frozenset(name.split(".")[0] for name in SERVED)
VERSIONS = {"xformers": "0.0.28", "apex": "0.1"}  # the APIs followed (flash_attn's is in its module)

ACTIVE = False  # set through state.patch by install(), so uninstall() switches serving off


def _migration_target() -> str | None:
    from npu_migrate.migrate.state import target

    name = target()
    if name is None and os.environ.get(ENV_MIGRATE) == "1" and "torch" not in sys.modules:
        import torch  # noqa: F401 - arms the migration of this process (npu_migrate.migrate.hook)

        name = target()
    return name if ACTIVE else None


def _should_serve(root: str) -> bool:
    name = _migration_target()
    if name is None:
        return False
    if name != "cuda":
        return True
    return importlib.machinery.PathFinder.find_spec(root) is None  # CUDA: only when the package is missing


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        impl_name = SERVED[name]
        module.__path__ = []  # a package, so submodule imports come back to the finder
        root = name.split(".")[0]
        if root in VERSIONS:
            module.__version__ = VERSIONS[root]
        if not impl_name:
            return
        impl = importlib.import_module(impl_name)
        names = list(getattr(impl, "__all__", ()))
        module.__all__ = names
        if hasattr(impl, "__version__"):
            module.__version__ = impl.__version__

        def __getattr__(attr: str) -> Any:
            if attr not in names:
                raise AttributeError(f"module {name!r} (served by {impl_name} under runtime migration) has no "
                                     f"attribute {attr!r}; it provides {', '.join(names)}")
            from npu_migrate.migrate import callers

            callers.record(f"{name}.{attr}", "redirected", f"served by {impl_name}")
            value = getattr(impl, attr)
            setattr(module, attr, value)  # recorded once; later uses cost nothing
            return value

        module.__getattr__ = __getattr__
        module.__dir__ = lambda: sorted(set(names) | set(vars(module)))


class LibsFinder(importlib.abc.MetaPathFinder):
    """The finder :func:`register` puts first on ``sys.meta_path``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        root = fullname.partition(".")[0]
        if root not in ROOTS:
            return None
        if fullname not in SERVED:
            parent = sys.modules.get(root)
            if parent is None or not isinstance(parent.__spec__.loader, _Loader):
                return None  # the real package is in use
            provided = ", ".join(n for n in SERVED if n.startswith(root))
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: under runtime migration npu_migrate serves {root} with "
                f"{provided} only; use torch ops for this part, or guard the import with try/except ImportError.",
                name=fullname)
        if not _should_serve(root):
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


FINDER = LibsFinder()


def register() -> None:
    """Put the finder first on ``sys.meta_path`` (once); it serves only while :data:`ACTIVE` is True."""
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)
