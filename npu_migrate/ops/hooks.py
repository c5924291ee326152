"""What the recorder hooks into torch while it records: phases, steps, the device's modules, fast paths.

Usage::

    from npu_migrate.ops import hooks

    undo = hooks.install(recorder)     # in Recorder.__enter__
    for step in reversed(undo):        # in Recorder.__exit__
        step()

* Global module forward hooks count the depth of forward calls (the ``forward`` phase); every
  optimizer's ``step``, watched (:mod:`npu_migrate.optim_steps`), marks the ``optimizer step``
  phase, counts steps and ends the script after ``--steps`` (:class:`npu_migrate.ops.record.AuditDone`).
* ``torch.overrides.has_torch_function`` ignores function modes while recording (see
  :func:`has_torch_function`).
* On the CPU target: ``Module.to``/``Module.cuda`` to a CUDA device put the module's parameters and
  buffers on the audited device (on ``meta`` with ``--meta``), and ``nm.get_device()`` answers with it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from npu_migrate import optim_steps
from npu_migrate.migrate.mapping import map_device
from npu_migrate.ops import meta


class AuditDone(BaseException):
    """Raised into the script when the audit has seen enough (``--steps`` optimizer steps, ``--seconds``).

    A ``BaseException``, like ``SystemExit``, so the script's ``except Exception`` does not swallow it.
    """


_TENSOR_FUNCTION = torch.Tensor.__torch_function__.__func__  # type: ignore[attr-defined]


def has_torch_function(relevant_args: Any) -> bool:
    """``torch.overrides.has_torch_function`` that ignores function modes (ours), not subclasses.

    nn.MultiheadAttention and nn.TransformerEncoderLayer leave their fast path when any function
    mode is active; on the NPU no mode is, so the audit must see the path the NPU takes.
    """
    for arg in relevant_args:
        kind = type(arg)
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            continue
        impl = getattr(kind, "__torch_function__", None)
        if impl is None or impl is torch._C._disabled_torch_function_impl:
            continue
        if getattr(impl, "__func__", None) is _TENSOR_FUNCTION:
            continue
        return True
    return False


def _count_steps(recorder: Any, undo: list[Callable[[], None]]) -> None:
    """Count optimizer steps (:mod:`npu_migrate.optim_steps`: torch's own step hooks stop firing after
    a ``torch.compile`` on torch 2.1) and end the script after ``--steps``."""

    def after(optimizer: Any, args: Any, kwargs: Any) -> None:
        recorder.npu_nodes.clear()  # the step's backward is over
        if getattr(optimizer, "_npu_migrate_unfused", False):
            _record_fused_kernel(recorder, optimizer)
        recorder.steps_done += 1
        if recorder.steps is not None and recorder.steps_done >= recorder.steps:
            raise AuditDone(f"ended after --steps {recorder.steps}")

    recorder.step_watch = optim_steps.watch(after=after)
    undo.append(recorder.step_watch.undo)


def _record_fused_kernel(recorder: Any, optimizer: Any) -> None:
    """Record the fused kernel a ``fused=True`` optimizer calls on the NPU, where this CPU ran it
    unfused (torch < 2.4 has no CPU kernel: :mod:`npu_migrate.migrate.patches.optim`).

    Its verdict is the release's: ``AdamW(fused=True)`` on 2.1.0.post17 is ``npu``
    (``_fused_adamw_``), ``Adam(fused=True)`` is ``no_kernel`` there on torch 2.1 (neither the
    release nor torch's CPU has ``_fused_adam_``): the step fails on the NPU.
    """
    name = f"_fused_{type(optimizer).__name__.lower()}_"
    if not hasattr(torch.ops.aten, name):
        return
    tensors = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    verdict = recorder.judge.verdict(f"aten::{name}", "default")
    recorder.add(f"aten::{name}", "default", verdict, tensors[:1] or [torch.empty(0)], recorder.site(),
                 f"torch.optim.{type(optimizer).__name__}.step", "optimizer step")


def install(recorder: Any) -> list[Callable[[], None]]:
    """Hook ``recorder`` (a :class:`npu_migrate.ops.record.Recorder`) into torch; return what undoes it."""
    undo: list[Callable[[], None]] = []
    module = torch.nn.modules.module

    def forward_pre(mod: Any, inputs: Any) -> None:
        recorder.forward_depth += 1

    def forward_post(mod: Any, inputs: Any, output: Any) -> None:
        recorder.forward_depth = max(0, recorder.forward_depth - 1)

    handles = [module.register_module_forward_pre_hook(forward_pre),
               module.register_module_forward_hook(forward_post, always_call=True)]
    _count_steps(recorder, undo)
    undo.extend(h.remove for h in handles)
    overrides = torch.overrides
    original = overrides.has_torch_function
    overrides.has_torch_function = has_torch_function
    undo.append(lambda: setattr(overrides, "has_torch_function", original))
    if (recorder.accelerator is None or recorder.fake) and recorder.target is not None:
        _mark_modules(recorder, undo)
        _neutral_device(recorder, undo)
    return undo



def _neutral_device(recorder: Any, undo: list[Callable[[], None]]) -> None:
    """Scripts written against this toolkit (``nm.get_device()``) get the audited device too."""
    from npu_migrate import device as _device

    original = _device.get_device

    def get_device(local_rank: int | None = None) -> torch.device:
        found = original(local_rank)
        return recorder.target if found.type == "cpu" else found

    _device.get_device = get_device
    undo.append(lambda: setattr(_device, "get_device", original))


def _mark_modules(recorder: Any, undo: list[Callable[[], None]]) -> None:
    """``model.cuda()``/``model.to("cuda")``: their parameters and buffers go on the device."""
    module_to = torch.nn.Module.to
    for name in ("to", "cuda"):
        original = getattr(torch.nn.Module, name)

        def moved(mod: Any, *args: Any, __original: Any = original, __name: str = name, **kwargs: Any) -> Any:
            device = kwargs.get("device", args[0] if args else None)
            to_device = __name == "cuda" or (device is not None and map_device(device) is not device)
            if to_device and recorder.fake:  # the whole module onto shapes without storage
                rest = {k: v for k, v in kwargs.items() if k != "device"}
                return module_to(mod, meta.META, *(args[1:] if __name == "to" and "device" not in kwargs
                                                   else ()), **(rest if __name == "to" else {}))
            out = __original(mod, *args, **kwargs)
            if to_device:
                for tensor in (*mod.parameters(), *mod.buffers()):
                    recorder.on_device[tensor] = True
            return out

        setattr(torch.nn.Module, name, moved)
        undo.append(lambda n=name, o=original: setattr(torch.nn.Module, n, o))

