"""One row of the CUDA table: what one API becomes under ``npu-migrate port`` and under runtime migration.

Usage::

    from npu_migrate.cuda_api.row import CudaApi, RUNTIME_KIND

    api = CudaApi("synchronize", "mapped", "synchronize", ("device",), cpu="nothing",
                  cpu_kind="noop", why="...")
    api.runtime_kind      # "noop": what the migration report says on the cpu target
    RUNTIME_KIND["mapped"]   # "redirected": the runtime kind a port kind implies

The port columns (``kind``, ``op``, ``params``, ``note``) say what a rewrite writes; the runtime
columns (``cpu``, ``cpu_note``, ``runtime``, ``cpu_kind``, ``why``, ``cuda_only``) say what runtime
migration does with the same name. Each port kind implies a runtime kind (:data:`RUNTIME_KIND`); a row
whose runtime kind differs says why (``why``), and tests/cuda_api/test_runtime.py fails on one
that does not. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

Kind = Literal["mapped", "noop", "unsupported", "ignored"]
RuntimeKind = Literal["redirected", "noop", "unmapped"]

RUNTIME_KIND: dict[str, Optional[RuntimeKind]] = {
    "mapped": "redirected", "noop": "noop", "unsupported": "unmapped", "ignored": None,
}
"""The runtime kind each port kind implies: a mapped API answers for the target, a no-op is a
no-op, an unsupported API raises ``MigrationError`` with the row's note, an ignored name (an
exception class, a typing re-export) is left as it is."""

Runtime = Literal["", "legacy_type", "amp"]
"""How runtime migration reaches the implementation, beside the usual (``""``: on an accelerator the
device module's function of the same name, on cpu the row's ``cpu`` implementation):
``legacy_type``, built by torch's CPU type of the same name and moved to the target, on every
target; ``amp``, sent to the target's AMP (``torch.amp``), on every target."""


@dataclass(frozen=True)
class CudaOnly:
    """A parameter of ``torch.cuda``'s function that the target's function of the same name may lack,
    and what runtime migration does with a value other than torch.cuda's default there (a default
    value asks for nothing and is always left out).

    Attributes:
        param: torch.cuda's parameter name (``"including_emulation"``).
        action: ``"drop"``: left out, the call's result is what CUDA's would be (the argument tunes
            how the work is done, or means nothing on the target); ``"refuse"``: the call raises
            ``MigrationError`` in one line, because the target would answer another question.
        why: the reason, said in the refusal (``"the snapshot would hold every pool's segments"``).
    """

    param: str
    action: Literal["drop", "refuse"]
    why: str


def drop(param: str, why: str) -> CudaOnly:
    """A CUDA-only parameter runtime migration leaves out where the target lacks it; ``why``: why that is right."""
    return CudaOnly(param, "drop", why)


def refuse(param: str, why: str) -> CudaOnly:
    """A CUDA-only parameter whose value (other than the default) the target cannot honour; ``why``: what
    the call would answer without it."""
    return CudaOnly(param, "refuse", why)


@dataclass(frozen=True)
class CudaApi:
    """What one ``torch.cuda`` API (or torch API with a device) becomes.

    Attributes:
        name: the name under ``torch.cuda`` (``"set_device"``, ``"amp.autocast"``).
        kind: ``"mapped"``, ``"noop"``, ``"unsupported"`` or ``"ignored"`` (what the port does).
        op: for ``mapped``: the device-neutral operation (a key of the port's TARGETS).
        params: torch.cuda's parameter names in order, for renaming keyword arguments.
        note: why (noop), what to do instead (unsupported: the port's report and runtime
            migration's ``MigrationError`` both say it), or a caveat of the mapping.
        cpu: the name of runtime migration's implementation on the cpu target (a key of
            ``npu_migrate.migrate.patches.cuda_namespace.CPU``), or ``""``: none. A ``noop``
            row's implementation also answers on an accelerator whose device module lacks the name.
        cpu_note: what the migration report says of the cpu answer (``"0 on cpu"``); ``""``: the
            implementation's own note.
        runtime: how runtime migration reaches it (:data:`Runtime`), or ``""``: the usual way.
        cpu_kind: the runtime kind on the cpu target where it differs from :data:`RUNTIME_KIND`
            of ``kind``; ``None``: no difference.
        why: why ``cpu_kind`` differs (required with it).
        cuda_only: what runtime migration does with each parameter of torch.cuda's function that
            the target's function lacks in some release (:class:`CudaOnly`); a parameter missing
            here is refused unless its value is the default, and tests/migrate/test_fit.py
            fails on it for every release of the table.
    """

    name: str
    kind: Kind
    op: Optional[str] = None
    params: tuple[str, ...] = ()
    note: str = ""
    cpu: str = ""
    cpu_note: str = ""
    runtime: Runtime = ""
    cpu_kind: Optional[RuntimeKind] = None
    why: str = ""
    cuda_only: tuple[CudaOnly, ...] = ()

    @property
    def runtime_kind(self) -> Optional[RuntimeKind]:
        """What the migration report says of a call on the cpu target (``None``: not patched)."""
        return self.cpu_kind or RUNTIME_KIND[self.kind]


Row = dict[str, Any]
"""A row's columns but its name, as the tables write them (``CudaApi(name, **row)`` builds it)."""


def mapped(op: str, *params: str, note: str = "", **runtime: Any) -> Row:
    """A row with a device-neutral equivalent ``op``; ``params`` are torch.cuda's parameter names."""
    return {"kind": "mapped", "op": op, "params": params, "note": note, **runtime}


def noop(note: str, **runtime: Any) -> Row:
    """A row harmless to skip off CUDA; ``note`` says why."""
    return {"kind": "noop", "note": note, **runtime}


def unsupported(note: str, **runtime: Any) -> Row:
    """A row with no equivalent; ``note`` says what to do instead."""
    return {"kind": "unsupported", "note": note, **runtime}


def ignored(note: str) -> Row:
    """A name that is not a device API (a constant, a module, another vendor's device)."""
    return {"kind": "ignored", "note": note}
