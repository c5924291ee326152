"""A family's extension (torch_npu): importing it once, and the one-line reason it cannot be used.

Usage::

    from npu_migrate.device import extension

    extension.load("torch_npu")                 # the module, or the line that says why not
    extension.extension_version(DEVICES["npu"])  # "2.14.0" or None, without importing it

An extension built for another torch release is refused before it is imported (importing it can
abort the interpreter); the decision reads its declared requirement (:mod:`npu_migrate.releases.pairs`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import re
from types import ModuleType

import torch

from npu_migrate import autoload
from npu_migrate.registry import DeviceSpec, by_extension


def _release_tuple(version: str) -> tuple[int, ...]:
    """``2.1.2+cpu`` -> ``(2, 1)``: the torch release line of a version."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return tuple(int(p) for p in match.groups()) if match else ()


def _install_hint(spec: DeviceSpec) -> str:
    """How to install the extension release that declares the installed torch.

    The release is read from a cached wheel's METADATA (:mod:`npu_migrate.releases.pairs`);
    without one, ``npu-migrate env --releases`` looks it up on the package index.
    """
    from npu_migrate.releases import pairs, wheels

    if spec.pip_name != wheels.DISTRIBUTION:  # npu_migrate.releases reads torch-npu's wheels only
        return f"the {spec.pip_name} release built for torch {torch.__version__}"
    found = pairs.pairing(torch.__version__)
    if found is not None:
        return f"pip install {spec.pip_name}=={found.version}, whose METADATA declares {found.requires_torch}"
    line = pairs.same_line(torch.__version__)
    if line is not None and line.requires_torch:  # the release of this torch line wants another build
        return (f"{pairs.install_torch(line.requires_torch)} then pip install {spec.pip_name}=={line.version}, "
                f"whose METADATA declares {line.requires_torch} (torch {torch.__version__} is another build)")
    return (f"the {spec.pip_name} release whose Requires-Dist accepts torch {torch.__version__} "
            f"(`npu-migrate env --releases` names it)")


def _mismatch(spec: DeviceSpec, ext_version: str) -> str | None:
    """The one-line refusal of an extension built for another torch release, else ``None``.

    Decided from the extension's declared requirement on torch (its METADATA); another build or
    patch of the same release is not refused here (``npu-migrate env`` warns about it).
    """
    from npu_migrate.releases import pairs

    requires = None
    try:
        requires = pairs.requirement_of_metadata(importlib.metadata.requires(spec.pip_name or "") or [])
    except importlib.metadata.PackageNotFoundError:
        pass  # built from source or on PYTHONPATH: its version is all there is
    pair = pairs.check(torch.__version__, ext_version, requires)
    if not pair.fatal:
        return None
    return autoload.fatal_message(pair)


@functools.lru_cache(maxsize=None)
def _load_extension(module_name: str) -> ModuleType | str:
    """Import a device extension once; return the module or the one-line reason it failed."""
    spec = by_extension(module_name)
    if spec is None:
        raise ValueError(f"{module_name!r} is the extension of no family in npu_migrate.registry.DEVICES")
    if importlib.util.find_spec(module_name) is None:
        toolkit = f" (and the {spec.toolkit.name} toolkit it needs)" if spec.toolkit is not None else ""
        return (
            f"{spec.name} needs {module_name}, which is not installed. Install the release that "
            f"declares torch {torch.__version__}: {_install_hint(spec)}{toolkit}."
        )
    try:
        dist_version = importlib.metadata.version(spec.pip_name or module_name)
    except importlib.metadata.PackageNotFoundError:
        dist_version = None  # built from source or on PYTHONPATH: check __version__ after import
    if dist_version is not None and (reason := _mismatch(spec, dist_version)):
        return reason  # importing a mismatched build can abort the interpreter, so stop here
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure of a broken install is reported as one line
        detail = " ".join(str(exc).split()) or type(exc).__name__
        tk = spec.toolkit
        fix = (f" If a {tk.libraries}/{tk.name} library is missing, source the {tk.name} environment first "
               f"(source {tk.set_env}) and check that the {tk.name} version matches {module_name}."
               if tk is not None else "")
        return f"{module_name} is installed but failed to import: {detail}.{fix}"
    if dist_version is None and (reason := _mismatch(spec, str(getattr(module, "__version__", "")))):
        return reason
    return module


def extension_version(spec: DeviceSpec) -> str | None:
    """Return the installed version of a family's extension without importing it."""
    if spec.extension is None:
        return None
    try:
        return importlib.metadata.version(spec.pip_name or spec.extension)
    except importlib.metadata.PackageNotFoundError:
        if importlib.util.find_spec(spec.extension) is None:
            return None
        module = _load_extension(spec.extension)
        return None if isinstance(module, str) else str(getattr(module, "__version__", None))




def load(module_name: str) -> ModuleType | str:
    """Import the extension ``module_name`` once; return the module or the one-line reason it failed."""
    return _load_extension(module_name)
