"""What a node runs that every node of a multi-node job must share: device family, backend, torch, torch_npu.

Usage (by :mod:`..nodes.membership`, in the job's shape)::

    mine = software.of_node(cfg.device, cfg.backend)   # {"device", "backend", "torch", "torch_npu"}
    software.describe(mine)                             # "torch 2.14.0 on cpu with gloo"
    software.fix(mine, theirs)                          # what to do when two nodes differ

Nothing in torch checks this. A node whose NPUs (or their software) are missing falls back to
another family when the family is detected, and joins with gloo while the others use hccl; a node
on another torch or torch_npu release (clusters often mix images) pickles another rendezvous state
and speaks another collective protocol. Either way the job hangs at its first collective, or fails
far from the cause. The releases compared are the public ones: ``2.14.0+cu130`` and ``2.14.0+cpu``
are one torch for this purpose; torch_npu counts only on the npu family.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any


def _release(module: str, distribution: str) -> str:
    """The public release of an imported module (its ``__version__``), else of its installed distribution."""
    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None) if loaded is not None else None
    if not isinstance(version, str):
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "(not installed)"
    return version.split("+", 1)[0]


def torch_release() -> str:
    """This node's torch release, without its build tag (``2.14.0``)."""
    return _release("torch", "torch")


def of_node(device: str, backend: str) -> dict[str, Any]:
    """This node's device family, backend and releases (torch_npu: on the npu family only, else None)."""
    return {"device": device, "backend": backend, "torch": torch_release(),
            "torch_npu": _release("torch_npu", "torch-npu") if device == "npu" else None}


def describe(stack: dict[str, Any]) -> str:
    """``torch 2.14.0 and torch_npu 2.14.0 on npu with hccl`` (a node that did not say: an older npu_migrate)."""
    if not stack:
        return "an older npu_migrate, which does not say what it runs"
    npu = f" and torch_npu {stack.get('torch_npu')}" if stack.get("torch_npu") else ""
    return f"torch {stack.get('torch')}{npu} on {stack.get('device')} with {stack.get('backend')}"


def fix(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What to do about a difference between two nodes' stacks."""
    if not mine or not theirs:
        return "every node must run the same npu_migrate release: install the same one on every node."
    if (mine.get("device"), mine.get("backend")) != (theirs.get("device"), theirs.get("backend")):
        return ("every node must use the same device family: pass the same --device on every node, and check that "
                "each has its devices and their software (a node without them falls back to another family).")
    return ("every node must run the same torch and torch_npu releases: install the same ones on every node "
            "(`npu-migrate env` shows a node's).")
