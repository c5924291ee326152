"""One verdict per aten overload, for one torch-npu release: ``npu``, ``decomposed``, ``cpu_fallback``,
``no_kernel``, ``error``.

Usage::

    from npu_migrate.ops.verdict import Judge, Verdict

    judge = Judge(operators.resolve("2.14.0"))
    judge.verdict("aten::special_entr", "default")   # Verdict.CPU_FALLBACK
    judge.verdict("aten::add", "Tensor")             # Verdict.NPU
    judge.verdict("aten::t", "default")              # Verdict.DECOMPOSED (CompositeExplicitAutograd)
    judge.composite_parent(torch.matmul)             # ("aten::matmul", "default") if the release has it
    judge.follow("aten::logcumsumexp", "default")    # DispatchKey.CompositeExplicitAutograd: its kernel
                                                     # runs on the NPU; what it calls is judged too

Two sources, neither restated here: the release's operator list (:mod:`npu_migrate.releases.operators`)
and torch's own knowledge: which overloads have composite kernels
(``torch._C._dispatch_has_kernel_for_dispatch_key``) and which are structured delegates of an
``out=`` overload (``structured_delegate:`` in ``torchgen/packaged/ATen/native/native_functions.yaml``,
shipped in the torch wheel).

The rules, in order:

1. ``npu::`` operators, and overloads the release registers (directly, or through their structured
   delegate), are ``npu``;
2. overloads torch itself implements for out-of-tree devices (``PrivateUse1``: c10d's collectives)
   are ``npu``; other namespaces (``torchvision::nms``) are judged like aten's below;
3. overloads with a composite kernel (``CompositeExplicitAutogradNonFunctional``,
   ``CompositeExplicitAutograd``, ``CompositeImplicitAutograd``) run it on every backend that has no
   kernel of its own: ``decomposed``, and the recorder runs that very kernel (:meth:`Judge.follow`) to
   record and judge what it calls, to the bottom. The functional form of a structured ``out=`` kernel
   is the exception: its generated ``CompositeExplicitAutogradNonFunctional`` kernel only allocates
   and calls the delegate, so it is judged as the delegate is (``npu`` by rule 1, else below);
4. anything else on a sparse tensor is an ``error`` (torch_npu's CPU fallback handles dense tensors only);
5. anything else torch has a CPU kernel for is ``cpu_fallback``: on the NPU it runs on the host,
   copying its tensors both ways;
6. the rest is ``no_kernel``: neither the release nor the host can run it (a CUDA-only operator
   such as ``aten::_fused_dropout``, a CUDA extension's own operator), so the step fails on the NPU.
   The audit meets these on a CUDA machine or under ``--meta`` (their meta kernels run there).
"""

from __future__ import annotations

import enum
import functools
import os
import re
from typing import Any, Callable

import torch

from npu_migrate.releases.operators import OperatorList


class Verdict(str, enum.Enum):
    """What happens to one aten overload on the NPU with one release."""

    NPU = "npu"
    DECOMPOSED = "decomposed"
    CPU_FALLBACK = "cpu_fallback"
    NO_KERNEL = "no_kernel"
    ERROR = "error"

    @property
    def bad(self) -> bool:
        """Whether this verdict makes the audit fail (exit status 1)."""
        return self in (Verdict.CPU_FALLBACK, Verdict.NO_KERNEL, Verdict.ERROR)


COMPOSITE_KEYS = ("CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd", "CompositeImplicitAutograd")
"""The composite alias keys, in the order the dispatcher prefers them for a backend without a kernel of
its own (``computeDispatchTableEntryWithDebug`` in c10's ``OperatorEntry.cpp``)."""
_STRUCTURED_COMPOSITE_KEYS = COMPOSITE_KEYS[1:]
# A structured delegate's CompositeExplicitAutogradNonFunctional kernel is torch's generated
# "allocate, then call the out= overload": it runs on the NPU only where the release registers that,
# and is judged as the delegate is (rule 3 of the module docstring).
_HOST_KEY = "CPU"


@functools.lru_cache(maxsize=1)
def structured_delegates() -> dict[str, str]:
    """``{"add.Tensor": "add.out", ...}`` from torch's packaged ``native_functions.yaml`` (``{}`` if absent)."""
    try:
        import torchgen
    except ImportError:
        return {}
    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return {}
    # A line scan, not a YAML parse: 0.6 MB of YAML takes seconds to parse and two keys are needed.
    found: dict[str, str] = {}
    func = None
    for line in text.splitlines():
        match = re.match(r"^- func: ([\w.]+)\(", line)
        if match:
            func = match.group(1)
            continue
        match = re.match(r"^\s+structured_delegate: ([\w.]+)", line)
        if match and func:
            found[func] = match.group(1)
    return found


# Advice for fallbacks that come from torch choosing a path, not from the model: our words, keyed by
# the overload's name. Everything else gets the registered sibling overloads, or the general advice.
_HINTS = {
    "_transformer_encoder_layer_fwd": "nn.TransformerEncoderLayer's inference fast path: turn it off with "
                                      "torch.backends.mha.set_fastpath_enabled(False) (torch >= 2.2)",
    "_native_multi_head_attention": "nn.MultiheadAttention's inference fast path: turn it off with "
                                    "torch.backends.mha.set_fastpath_enabled(False) (torch >= 2.2)",
}


def _has_kernel(op: str, overload: str, dispatch_key: str) -> bool:
    """Whether torch registers a kernel for ``dispatch_key`` (TorchScript-only overloads have none)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(
            op if overload in ("default", "") else f"{op}.{overload}", dispatch_key)
    except RuntimeError:  # aten::to.prim_Device and the like: not in the dispatcher
        return False


def _schema_key(name: str, overload: str) -> str:
    return name if overload in ("default", "") else f"{name}.{overload}"


class Judge:
    """Verdicts for one release, memoised per overload."""

    def __init__(self, operators: OperatorList) -> None:
        self.operators = operators
        self._memo: dict[tuple[str, str, bool], Verdict] = {}
        self._parents: dict[Any, tuple[str, str] | None] = {}
        self._follow: dict[tuple[str, str], Any] = {}

    def verdict(self, op: str, overload: str, sparse: bool = False) -> Verdict:
        """The verdict for ``op`` (``aten::name``) ``overload``; ``sparse``: a sparse tensor was an input."""
        key = (op, overload, sparse)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._decide(op, overload, sparse)
        return found

    def _decide(self, op: str, overload: str, sparse: bool) -> Verdict:
        namespace, _, name = op.rpartition("::")
        if self.operators.registers(op, overload):
            return Verdict.NPU
        delegate = structured_delegates().get(_schema_key(name, overload)) if namespace == "aten" else None
        if delegate is not None:
            base, _, delegate_overload = delegate.partition(".")
            if self.operators.registers(f"aten::{base}", delegate_overload or "default"):
                return Verdict.NPU
        if _has_kernel(op, overload, "PrivateUse1"):
            return Verdict.NPU  # torch's own kernel for out-of-tree devices (c10d's collectives: hccl)
        if self._composite_key(op, overload, structured=delegate is not None) is not None:
            return Verdict.DECOMPOSED
        if sparse:
            return Verdict.ERROR
        return Verdict.CPU_FALLBACK if _has_kernel(op, overload, _HOST_KEY) else Verdict.NO_KERNEL

    @staticmethod
    def _composite_key(op: str, overload: str, structured: bool) -> str | None:
        """The composite alias key whose kernel the NPU runs for ``op`` when the release has none."""
        keys = _STRUCTURED_COMPOSITE_KEYS if structured else COMPOSITE_KEYS
        return next((key for key in keys if _has_kernel(op, overload, key)), None)

    def follow(self, op: str, overload: str) -> Any:
        """The ``torch._C.DispatchKey`` of the composite kernel the NPU runs for a ``decomposed`` overload.

        The recorder runs that kernel itself (``OpOverload._op_dk``) so that what it calls reaches its
        dispatch mode and is judged in turn; None where the overload is not ``decomposed``.
        """
        key = (op, overload)
        if key in self._follow:
            return self._follow[key]
        found = None
        if self.verdict(op, overload) is Verdict.DECOMPOSED:
            name = op.rpartition("::")[2]
            structured = op.startswith("aten::") and _schema_key(name, overload) in structured_delegates()
            composite = self._composite_key(op, overload, structured)
            found = getattr(torch._C.DispatchKey, composite) if composite is not None else None
        self._follow[key] = found
        return found

    def hint(self, op: str, overload: str, verdict: Verdict) -> str:
        """What to do about a fallback or an error: registered sibling overloads, else the general advice."""
        if not verdict.bad:
            return ""
        namespace, _, name = op.rpartition("::")
        if verdict is Verdict.ERROR:
            return "sparse tensors have no CPU fallback on the NPU: densify (to_dense()) before this call"
        if verdict is Verdict.NO_KERNEL:
            if namespace == "aten" and name.startswith("_fused_") and name.endswith("_"):
                return ("the release has no kernel for this fused optimizer and torch none on the host: the "
                        "step fails on the NPU; use fused=False (foreach) or torch_npu.optim's NpuFused class")
            if namespace not in ("aten", "npu"):
                return (f"an operator of {namespace}:: with neither an NPU nor a CPU kernel (a CUDA extension's): "
                        "the step fails on the NPU; replace it with torch ops or torch_npu's own operator")
            return ("neither the release nor the host has a kernel for it (CUDA only): the step fails on the NPU; "
                    "take the path torch takes off CUDA, or call a registered operator")
        if name in _HINTS:
            return _HINTS[name]
        siblings = self.operators.overloads_of(name) if namespace == "aten" else []
        if siblings:
            return f"the release registers {', '.join('aten::' + s for s in siblings[:3])}: call that form instead"
        if namespace not in ("aten", "npu"):
            return f"{namespace}:: operators have no NPU kernel: move the call out of the step or use a torch op"
        return "runs on the host, copying its tensors both ways: move it out of the step or write it with registered ops"

    def composite_parent(self, func: Callable[..., Any]) -> tuple[str, str, Verdict] | None:
        """The aten operator a torch function is, when torch decomposes it (composite) on the CPU.

        Returns ``(op, overload, verdict)``: ``npu`` when the release registers the composite itself
        (then the pieces recorded beneath it are not the NPU's), ``decomposed`` when it does not;
        None for functions that are not a composite aten operator.
        """
        if func in self._parents:
            return self._parents[func]  # type: ignore[return-value]
        found = None
        name = getattr(func, "__name__", "")
        try:
            packet = getattr(torch.ops.aten, name) if name and not name.startswith("_") else None
            overloads = [o for o in packet.overloads() if not o.endswith("out")] if packet is not None else []
        except (AttributeError, RuntimeError):  # not an aten operator
            overloads = []
        composite = [o for o in overloads if _has_kernel(f"aten::{name}", o, "CompositeImplicitAutograd")]
        # Only where every functional overload decomposes: then whichever the call took, torch's
        # CPU pieces stand for the one composite operator.
        if overloads and len(composite) == len(overloads):
            registered = [o for o in composite if self.operators.registers(f"aten::{name}", o)]
            found = (f"aten::{name}", registered[0], Verdict.NPU) if registered else (
                f"aten::{name}", composite[0], Verdict.DECOMPOSED)
        self._parents[func] = found
        return found
