"""torch's device-extension autoload, and importing torch safely under it.

Since torch 2.5, ``import torch`` imports every package that registers a ``torch.backends``
entry point (torch_npu does: ``torch_npu = torch_npu:_autoload``). On a node where the CANN
toolkit is missing or was not sourced, torch_npu fails there, and so does ``import torch``
itself, for every program, with "Failed to load the backend extension: torch_npu". A failed
``import torch`` cannot be retried in the same process, so this module works before torch is
imported, from package metadata only:

Usage::

    from npu_migrate import autoload

    autoload.disable_unless_needed("cpu")   # --device cpu/cuda: TORCH_DEVICE_BACKEND_AUTOLOAD=0
    autoload.check_versions()               # a torch_npu built for another torch would abort the interpreter
    try:
        import torch
    except RuntimeError as exc:
        line = autoload.explain(exc)        # one line naming what failed and the fix, or None

Entry points (:func:`check_versions`, :func:`explain`) are cheap: nothing here imports torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from npu_migrate.errors import DeviceUnavailableError
from npu_migrate.registry import BUILT_IN, DEVICES, ENV_DEVICE, by_extension

ENV_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
"""torch's switch: ``0`` stops ``import torch`` from importing device extensions."""

GROUP = "torch.backends"
_FAILED = re.compile(r"Failed to load the backend extension: (\S+?)\.?(\s|$)")

# Forcing a family built into torch (the table's rows without an extension) makes autoloading an
# extension pointless, and on a node without its toolkit, fatal.
_TRAIN_WITHOUT = " or ".join(BUILT_IN)
_FORCE_BUILT_IN = " or ".join(f"--device {name}" for name in BUILT_IN)


@dataclass(frozen=True)
class Extension:
    """One ``torch.backends`` entry point: what ``import torch`` will import.

    Attributes:
        name: the entry point's name (``torch_npu``).
        target: what it loads (``torch_npu:_autoload``).
        distribution: the installed distribution that declares it.
        version: that distribution's version.
    """

    name: str
    target: str
    distribution: str
    version: str


def enabled() -> bool:
    """Whether ``import torch`` will auto-load extensions (torch's own test of the variable)."""
    return os.environ.get(ENV_AUTOLOAD, "1") == "1"


def extensions() -> list[Extension]:
    """Every ``torch.backends`` entry point installed, read from metadata without importing."""
    import importlib.metadata  # here: `npu-migrate --help` should not pay for it

    found = []
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == GROUP:
                found.append(Extension(ep.name, ep.value, dist.metadata["Name"] or "?", dist.version))
    return found


def disable_unless_needed(device: str | None) -> bool:
    """Turn autoload off for this process and its children when ``device`` needs no extension.

    ``--device cpu`` or ``--device cuda`` (or ``NPU_MIGRATE_DEVICE``) then keeps working on a
    node whose torch_npu cannot load, and so do the workers started from here. A value the
    user set is never changed.

    Args:
        device: the family asked for; ``None`` or ``auto`` falls back to ``NPU_MIGRATE_DEVICE``.

    Returns:
        Whether this call set the variable.
    """
    name = (device or "").strip().lower()
    if name in ("", "auto"):
        name = os.environ.get(ENV_DEVICE, "").strip().lower()
    if name not in BUILT_IN or ENV_AUTOLOAD in os.environ:
        return False
    os.environ[ENV_AUTOLOAD] = "0"
    return True


def check_versions() -> None:
    """Refuse, before ``import torch``, an auto-loaded extension of the table (torch_npu) built for
    another torch release.

    The decision reads torch_npu's declared requirement on torch (its METADATA's
    ``Requires-Dist``, :mod:`npu_migrate.releases.pairs`). A build for another minor release
    (torch_npu 2.1.0.postN under torch 2.14) can abort the interpreter at import, where no
    message is possible, so it is refused here. Another build or patch of the same release
    (torch 2.1.0 for ``torch==2.1.0+cpu``) loads; ``npu-migrate env`` warns about it.

    Raises:
        DeviceUnavailableError: one line naming both versions, the declared requirement and the fixes.
    """
    if not enabled():
        return
    ours = {spec.extension for spec in DEVICES.values() if spec.extension}
    for ext in extensions():
        if ext.name not in ours:
            continue
        from npu_migrate.releases import pairs  # here: only a node with an extension pays for it

        pair = pairs.check_installed(ext.distribution)
        if pair.fatal:
            raise DeviceUnavailableError(fatal_message(pair) + f" Or set {ENV_AUTOLOAD}=0 to train on {_TRAIN_WITHOUT}.")


def fatal_message(pair: "pairs.PairCheck") -> str:  # noqa: F821 - imported lazily
    """The one line for a torch_npu built for another torch release: both versions and both fixes.

    The release that pairs with the installed torch is named where a cached wheel says which.
    """
    from npu_migrate.releases import pairs, wheels

    line = ".".join(map(str, pairs.release_of(pair.torch or "")))
    other = pairs.pairing(pair.torch or "")
    pick = (f"pip install {wheels.DISTRIBUTION}=={other.version}" if other is not None else
            f"install the {wheels.DISTRIBUTION} release that declares torch {pair.torch} "
            f"(`npu-migrate env --releases` names it)")
    return (
        f"{pair.describe()} but torch {pair.torch} is installed (release {line}), and importing it can "
        f"abort the interpreter. Install the pair it declares: {pair.hint()}; or keep this torch: {pick}."
    )


def explain(exc: BaseException) -> str | None:
    """The one-line answer for an ``import torch`` that failed in autoload, else ``None``.

    Args:
        exc: what ``import torch`` (or anything that imported it) raised.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        match = _FAILED.search(str(current))
        if isinstance(current, RuntimeError) and match:
            cause = current.__cause__ or current.__context__
            detail = " ".join(str(cause).split()) if cause is not None else ""
            detail = f"{type(cause).__name__}: {detail}" if cause is not None and not detail else detail
            name = match.group(1)
            spec = by_extension(name)
            if spec is not None and spec.toolkit is not None:
                use = (f"To use the {spec.name.upper()}, source the {spec.toolkit.name} environment first "
                       f"(source {spec.toolkit.set_env})")
            else:
                use = f"To use {name}, repair its installation"
            return (
                f"`import torch` failed: it auto-loads {name}, which failed"
                f"{': ' + detail if detail else ''}. {use}; to train on {_TRAIN_WITHOUT}, set {ENV_AUTOLOAD}=0 "
                f"({_FORCE_BUILT_IN} does this for you)."
            )
        current = current.__cause__ or current.__context__
    return None
