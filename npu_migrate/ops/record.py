"""Recording the operators a script sends to the device: a dispatch mode, a function mode, phases, steps.

Usage::

    from npu_migrate.ops.record import Recorder

    recorder = Recorder(judge, steps=2)          # judge: npu_migrate.ops.verdict.Judge
    with recorder:                               # after runtime migration is installed
        run_the_script()                         # ends with AuditDone after 2 optimizer steps
    recorder.entries                             # {(op, overload, phase, site, via): Entry}

What is recorded, for every aten overload that reaches the device:

* the overload (a ``TorchDispatchMode``) and the torch function the user called around it (a
  ``TorchFunctionMode``: the outermost one; torch pops a function mode while it runs, so functions
  called inside another are not seen);
* the user's call site: ``file:line`` of the nearest frame in user code, classified as runtime
  migration classifies frames (:mod:`npu_migrate.migrate.callers`);
* the dtypes of its tensors and the phase: ``backward`` (the autograd engine runs it),
  ``optimizer step`` (between the global optimizer step hooks), ``forward`` (inside a module's
  forward), else ``other``.

**Which tensors are on the device.** On an accelerator target, those whose device is the target's.
On the CPU target every tensor is a CPU tensor, so the device's are tracked: a tensor is on the
device when it was made by a call that runtime migration gave the target's device (``x.cuda()``,
``x.to("cuda")``, ``torch.zeros(..., device="cuda")``, ``model.cuda()``: the call carries
:func:`npu_migrate.migrate.mapping.target_device`'s very object), or computed from one. Tensors that
never went to the device (data loading, the optimizer's CPU step counters) are not counted.

**Composites.** Where the release registers a composite operator itself (``matmul``,
``scaled_dot_product_attention``), the CPU decomposition recorded beneath the function is not the
NPU's: the function's operator is recorded as ``npu`` in its place, and so is the backward of the
autograd nodes made beneath it. Where the release registers neither an operator the dispatch mode
sees nor anything that replaces it, and torch's kernel for it is composite (``logcumsumexp``,
``huber_loss_backward``), the NPU runs that kernel: the mode runs it too (:mod:`npu_migrate.ops.follow`)
with itself pushed again, and records what it calls at the same call site and phase, with the
composites on the way (``via``), to the bottom. What is hooked into torch meanwhile:
:mod:`npu_migrate.ops.hooks`.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from npu_migrate.migrate import callers
from npu_migrate.migrate.mapping import target_device
from npu_migrate.migrate.state import STATE
from npu_migrate.ops import follow, hooks, meta
from npu_migrate.ops.hooks import AuditDone  # noqa: F401 (raised into the script; runners catch it from here)
from npu_migrate.ops.verdict import Judge, Verdict


PHASES = ("forward", "backward", "optimizer step", "other")
_SYNC_TAGS = ("data_dependent_output",)  # the host reads a value from device memory (.item(), equal)
_HOST_READS = ("tolist", "numpy", "cpu")  # Tensor methods that copy device memory to the host
_MASK_DTYPES = (torch.bool, torch.uint8)
# A call frame: (function, site, seeded, beneath a registered composite, composites followed, phase).
_QUIET = ("", None, False, False, (), None)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SDPA_PIECES = ("aten::_scaled_dot_product_", "aten::_fused_sdp_choice")  # SDPA's CPU backends
_DEVICE_PROPERTY = torch.Tensor.device  # its __get__ reaches the function mode
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_BACKWARD_CALLS = ("torch.Tensor.backward", "torch.autograd.backward", "torch.autograd.grad")
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MAX_FOLLOW = 32  # composites nested deeper than this are recorded, not followed (none in torch is)


@dataclass
class Entry:
    """One aten overload at one call site in one phase.

    Attributes:
        verdict: what the release does with it.
        count: calls recorded.
        dtypes: dtypes of its tensors.
        function: the torch function the user called around it (``torch.special.entr``), or ``""``.
        via: the composite kernels, outermost first, whose kernel called it on the NPU
            (``("aten::logcumsumexp",)`` for ``aten::_logcumsumexp``); ``()`` where the user's code did.
    """

    verdict: Verdict
    count: int = 0
    dtypes: set[str] = field(default_factory=set)
    function: str = ""
    via: tuple[str, ...] = ()


@dataclass
class Sync:
    """A host synchronisation at one site: what caused it and how often."""

    what: str
    count: int = 0


def _function_name(func: Any) -> str:
    try:
        with warnings.catch_warnings():  # torch 2.1 builds its table from deprecated torch.has_cuda & co.
            warnings.simplefilter("ignore")
            name = torch.overrides.resolve_name(func)
    except Exception:  # resolve_name reads attributes of arbitrary callables
        name = None
    if name:
        return name.replace("torch._VariableFunctionsClass.", "torch.")  # torch.randn's home in resolve_name
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else getattr(func, "__name__", str(func))




def _tensors(values: Any) -> list[torch.Tensor]:
    """Tensors among aten arguments (``Tensor``, ``Tensor[]``, ``Tensor?[]``): one level of lists."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


class Recorder:
    """Records device operators while active (``with recorder:``); see the module docstring."""

    def __init__(self, judge: Judge, steps: int | None = 2, fake: bool = False) -> None:
        self.judge = judge
        self.steps = steps
        self.steps_done = 0
        self.entries: dict[tuple[str, str, str, str, tuple[str, ...]], Entry] = {}
        self.syncs: dict[tuple[str, str], Sync] = {}
        self.on_device = WeakIdKeyDictionary()
        self._local = threading.local()
        self._undo: list[Callable[[], None]] = []
        spec = STATE.target
        self.accelerator = spec.name if spec is not None and spec.is_accelerator else None
        self.target = target_device(0) if spec is not None and spec.name != "cuda" else None
        self.fake = fake and self.accelerator is None  # --meta: the device's tensors are meta tensors
        if self.fake:
            self.accelerator = "meta"
        self.forward_depth = 0
        self.step_watch: Any = None  # npu_migrate.optim_steps.StepWatch, while recording
        self._modes: list[Any] = []
        # Autograd nodes made beneath a composite the release registers: their backward is the NPU's
        # own too. Keyed by id, holding the node (nodes take no weak references); cleared each step.
        self.npu_nodes: dict[int, Any] = {}
        # What else watches the recording (``npu-migrate advise``): ``op(name, overload, phase, site,
        # function, via, inputs, outputs)`` for each recorded call, ``sync(what, site)`` for each sync.
        self.observer: Any = None

    # -- state of the calling thread --------------------------------------------------------------
    def _frame(self) -> list[Any]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def is_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is on the audited device (see "Which tensors are on the device")."""
        if self.accelerator is not None:
            return tensor.device.type == self.accelerator
        return tensor in self.on_device

    def mark(self, value: Any) -> None:
        """Put the tensors of ``value`` (a tensor, or a list/tuple of them) on the device."""
        if self.accelerator is not None:
            return
        for tensor in _tensors(value if isinstance(value, (list, tuple)) else (value,)):
            self.on_device[tensor] = True

    def phase(self, inputs: list[torch.Tensor] = ()) -> str:  # type: ignore[assignment]
        """``backward``, ``optimizer step``, ``forward`` (in a module's forward, or building the
        autograd graph from ``inputs``: the loss too), else ``other``."""
        if torch._C._current_autograd_node() is not None:
            return "backward"
        if self.step_watch is not None and self.step_watch.stepping():
            return "optimizer step"
        if self.forward_depth or (torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):
            return "forward"
        return "other"

    @staticmethod
    def site() -> str:
        """``file:line`` of the nearest frame in user code."""
        frame = sys._getframe(2)
        while frame is not None and callers.is_internal(frame.f_code.co_filename):
            frame = frame.f_back
        return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"

    # -- what the modes call ------------------------------------------------------------------------
    def add(self, op: str, overload: str, verdict: Verdict, tensors: list[torch.Tensor], site: str,
            function: str, phase: str | None = None, via: tuple[str, ...] = ()) -> str:
        """Count one call; return its phase."""
        key = (op, overload, phase or self.phase(tensors), site, via)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = Entry(verdict, function=function, via=via)
        entry.count += 1
        for tensor in tensors:
            entry.dtypes.add(str(tensor.dtype).replace("torch.", ""))
        return key[2]

    def add_sync(self, what: str, site: str) -> None:
        key = (what, site)
        sync = self.syncs.get(key)
        if sync is None:
            sync = self.syncs[key] = Sync(what)
        sync.count += 1
        if self.observer is not None:
            self.observer.sync(what, site)

    def on_dispatch(self, mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one aten overload (``func``) for the dispatch ``mode``, recording it if it is the device's."""
        stack = self._frame()
        top = stack[-1] if stack else _QUIET
        inputs = _tensors(args) + _tensors(kwargs.values()) if kwargs else _tensors(args)
        if not top[2] and not any(self.is_device(t) for t in inputs):
            return func(*args, **kwargs)
        quiet = top[3]  # beneath a composite the release registers: not the NPU's operators
        if not quiet and self.npu_nodes:
            node = torch._C._current_autograd_node()
            quiet = node is not None and id(node) in self.npu_nodes
        if quiet:
            out = func(*args, **kwargs)
            self.mark(_tensors(out if isinstance(out, (list, tuple)) else (out,)))
            return out
        via = top[4]
        name, overload = func._schema.name, func._overloadname
        if name.startswith(_SDPA_PIECES) and not via and self._sdpa_registered():
            return self._sdpa_piece(func, name, args, kwargs, inputs, top)
        label = name if overload in ("default", "") else f"{name}.{overload}"
        if via:  # called by a composite kernel: its scalars come as numbers (see npu_migrate.ops.follow)
            args, kwargs = follow.wrap_numbers(func, args, kwargs)
            if label in via:  # a kernel redispatching its own operator (detach): counted once, as the caller
                out = func(*args, **kwargs)
                self.mark(_tensors(out if isinstance(out, (list, tuple)) else (out,)))
                return out
        site = top[1] or self.site()
        sparse = any(t.layout != torch.strided for t in inputs)
        verdict = self.judge.verdict(name, overload, sparse)
        phase = top[5]
        key = self.judge.follow(name, overload) if verdict is Verdict.DECOMPOSED and not sparse else None
        # Plain tensors only: a subclass (DTensor, FakeTensor) handles the operator in its own
        # __torch_dispatch__ and runs it on plain tensors, where the NPU's kernels are chosen.
        if key is None or len(via) >= _MAX_FOLLOW or not all(type(t) in _PLAIN for t in inputs):
            try:
                out = func(*args, **kwargs)
            except NotImplementedError:
                # A composite's callee this machine cannot run (no meta kernel under --meta:
                # aten::_logcumsumexp): the NPU calls it all the same, so it is recorded before the
                # composite gives way to the operator itself (_follow).
                if via:
                    self.add(name, overload, verdict, inputs, site, top[0], phase, via)
                raise
        else:
            phase = phase or self.phase(inputs)
            out = self._follow(mode, func, key, args, kwargs, (top[0], site, True, False, (*via, label), phase))
        outputs = _tensors(out if isinstance(out, (list, tuple)) else (out,))
        self.mark(outputs)
        phase = self.add(name, overload, verdict, inputs or outputs, site, top[0], phase, via)
        if self.observer is not None:
            self.observer.op(name, overload, phase, site, top[0], via, inputs, outputs)
        if self._syncs(func, name, inputs):
            self.add_sync(name, site)
        return out

    def _sdpa_registered(self) -> bool:
        found = getattr(self, "_sdpa", None)
        if found is None:
            found = self._sdpa = self.judge.operators.registers("aten::scaled_dot_product_attention", "default")
        return found

    def _sdpa_piece(self, func: Any, name: str, args: tuple, kwargs: dict, inputs: list[torch.Tensor],
                    top: tuple) -> Any:
        """A kernel of torch's scaled_dot_product_attention on this CPU (its flash, efficient or math
        backend, their backward), reached where the function mode did not see SDPA itself (called
        inside F.multi_head_attention_forward, whose handler runs without the mode). The release
        registers SDPA, so the NPU runs its own kernel there: recorded as SDPA, forward only."""
        out = func(*args, **kwargs)
        outputs = _tensors(out if isinstance(out, (list, tuple)) else (out,))
        self.mark(outputs)
        if not name.endswith("_backward"):
            site = top[1] or self.site()
            self.add("aten::scaled_dot_product_attention", "default", Verdict.NPU, inputs, site, top[0], top[5])
        return out

    def _follow(self, mode: Any, func: Any, key: Any, args: tuple, kwargs: dict, frame: tuple) -> Any:
        """Run ``func``'s composite kernel for ``key`` as the NPU would, recording what it calls.

        A kernel this machine cannot run (none in torch should fail where the operator itself runs)
        gives way to the operator itself, unless it may have changed its arguments already.
        """
        stack = self._frame()
        stack.append(frame)
        try:
            with mode:
                return follow.run(func, key, args, kwargs)
        except Exception:
            if func._schema.is_mutable:
                raise
        finally:
            stack.pop()
        return func(*args, **kwargs)

    @staticmethod
    def _syncs(func: Any, name: str, inputs: list[torch.Tensor]) -> bool:
        tags = {getattr(t, "name", str(t)) for t in func.tags}
        if any(t in tags for t in _SYNC_TAGS):
            return True
        masked = any(t.dtype in _MASK_DTYPES for t in inputs[1:])
        if "dynamic_output_shape" in tags:
            return name != "aten::index" or masked  # index.Tensor syncs for boolean masks only
        return name in ("aten::index_put", "aten::index_put_", "aten::_index_put_impl_") and masked

    def on_function(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one torch function, noting what the dispatch mode needs to know about it."""
        stack = self._frame()
        target = self.target
        if (getattr(func, "__self__", None) is _DEVICE_PROPERTY and target is not None and self.accelerator is None
                and args and self.is_device(args[0])):
            # x.device of a device tensor is the device (the CPU object the script's "cuda" became),
            # so .to(x.device), torch.zeros(..., device=x.device) stay on it, as on the NPU, and are
            # not host copies (clip_grad_norm_'s norm.to(first_device)).
            return target
        seeded = target is not None and (self.accelerator is None or self.fake) and (
            any(a is target for a in args) or any(v is target for v in kwargs.values()))
        if seeded and self.fake:
            args, kwargs = meta.swap(args, kwargs, target)
        device_args = [t for t in (_tensors(args) + _tensors(kwargs.values()) if kwargs else _tensors(args))
                       if self.is_device(t)]
        if not device_args and not seeded:
            stack.append(_QUIET)  # its operators are recorded only if a device tensor shows up
            try:
                return func(*args, **kwargs)
            finally:
                stack.pop()
        parent = self.judge.composite_parent(func)
        name = _function_name(func)
        site = self.site()
        short = getattr(func, "__name__", "")
        if seeded and short == "to" and self.observer is not None and args and isinstance(args[0], torch.Tensor) \
                and not self.is_device(args[0]):
            blocking = not (kwargs.get("non_blocking") or any(a is True for a in args[2:3]))
            getattr(self.observer, "host_copy", lambda *_: None)(site, blocking)
        if self.fake and device_args and short in meta.HOST_READS:
            self.add_sync(f"Tensor.{short}", site)
            return meta.stand_in(short, device_args[0])
        # What backward() does before the engine runs (ones_like for the loss's implicit gradient) is
        # the backward's.
        phase = "backward" if name in _BACKWARD_CALLS else None
        stack.append((name, site, seeded, parent is not None and parent[2] is Verdict.NPU, (), phase))
        try:
            out = func(*args, **kwargs)
        finally:
            stack.pop()
        if seeded:
            self.mark(out)  # x.to(device) on the CPU target returns x itself: nothing was dispatched
        if parent is not None:
            phase = self.add(parent[0], parent[1], parent[2], device_args, site, name)
            if self.observer is not None:
                self.observer.op(parent[0], parent[1], phase, site, name, (), device_args,
                                 _tensors(out if isinstance(out, (list, tuple)) else (out,)))
            if parent[2] is Verdict.NPU:
                self._note_nodes(out, device_args)
        if device_args and short in _HOST_READS:
            self.add_sync(f"Tensor.{short}", site)
        elif device_args and short == "to" and self._to_host(args, kwargs):
            self.add_sync("Tensor.to(cpu)", site)
        return out

    def _note_nodes(self, out: Any, inputs: list[torch.Tensor]) -> None:
        """Remember the autograd nodes between ``out`` and ``inputs`` (the composite's own graph)."""
        # Held while walking: a node's Python object can be made afresh on each access, and a freed
        # one's id can come back as another node's.
        held = [t.grad_fn for t in inputs if t.grad_fn is not None]
        stop = {id(n) for n in held}
        pending = [t.grad_fn for t in _tensors(out if isinstance(out, (list, tuple)) else (out,))
                   if t.grad_fn is not None]
        while pending:
            node = pending.pop()
            if node is None or id(node) in stop or id(node) in self.npu_nodes:
                continue
            if type(node).__name__ == "AccumulateGrad":
                continue
            self.npu_nodes[id(node)] = node
            pending.extend(n for n, _ in node.next_functions)

    def _to_host(self, args: tuple, kwargs: dict) -> bool:
        for value in (*args[1:], kwargs.get("device")):
            if isinstance(value, str) and value.startswith("cpu"):
                return True
            if isinstance(value, torch.device) and value.type == "cpu" and value is not self.target:
                # torch's own code moves tensors to devices read from tensors (clip_grad_norm_'s
                # norm.to(first_device), clip_coef.to(device) of its per-device groups): on this CPU
                # stand-in those read "cpu", on the NPU they are the NPU. Not a host copy.
                frame = sys._getframe(3)  # past on_function, the mode and npu_migrate's Tensor.to patch
                while frame is not None and frame.f_code.co_filename.startswith(_OWN_DIR):
                    frame = frame.f_back
                return frame is None or not frame.f_code.co_filename.startswith(_TORCH_DIR)
        return False

    def __enter__(self) -> "Recorder":
        self._undo.extend(hooks.install(self))
        self._modes = [_FunctionMode(self), _DispatchMode(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        self._modes = []
        while self._undo:
            self._undo.pop()()


class _FunctionMode(TorchFunctionMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.recorder.on_function(func, args, kwargs or {})


class _DispatchMode(TorchDispatchMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.recorder.on_dispatch(self, func, args, kwargs or {})
