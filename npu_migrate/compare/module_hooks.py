"""The probe's per-module hooks (``--probe-level modules``): module names, selection, each call's tensors.

Usage::

    class Probe(ModuleHooks):            # npu_migrate.compare.probe: the mixin's state lives there
        def _live(self) -> bool: ...     # is this probe the one recording?

:class:`ModuleHooks` names every module once (its path in the model the first forward comes from),
selects names with ``--probe-modules``, ``--probe-steps`` and ``--probe-ranks``, and summarises
(:func:`~npu_migrate.compare.stats.tensor_stats`) each selected call's inputs and outputs in the
forward pass and their gradients and the parameters' in the backward pass. A step's summaries are
stacked into one :class:`~npu_migrate.compare.stats.ModuleStats` per step (``_take_modules``).
The state it reads is set by ``Probe.__init__`` and ``Probe._reset_step``.
"""

from __future__ import annotations

import functools
import re
import sys
import weakref
from typing import Any, Callable, Iterator

import torch

from npu_migrate.compare import records
from npu_migrate.compare.settings import COMPILED_ONLY, ProbeSettings
from npu_migrate.compare.stats import ModuleStats, dtype_name, tensor_stats

_MAX_NEST = 3  # how deep inputs/outputs made of tuples, lists and dicts are searched for tensors


def wrapper_types() -> tuple[type, ...]:
    """Module classes that only wrap ``.module`` and are not recorded themselves (DDP, DataParallel)."""
    return (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` is what ``torch.compile(model)`` returns (an ``OptimizedModule``)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # none loaded: nothing was compiled
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return optimized is not None and isinstance(module, optimized)


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP, DataParallel and ``torch.compile`` wrappers, nested in any order."""
    while True:
        if isinstance(module, wrapper_types()):
            module = module.module
        elif is_compiled(module):
            module = module._orig_mod
        else:
            return module


OLD_DYNAMO = not hasattr(getattr(torch, "compiler", None), "is_compiling")
"""torch < 2.3, whose dynamo compiles every frame a compiled model calls (see :func:`outside_compile`)."""
compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or torch._utils.is_compiling
"""True while dynamo traces (``torch.compile``): a constant to it, so a hook that returns at once
when it is true adds nothing to the graph (torch >= 2.3 ``torch.compiler``, else ``torch._utils``)."""


def outside_compile(hook: Callable[..., None]) -> Callable[..., None]:
    """``hook`` as a global module hook that ``torch.compile`` never compiles.

    Traced by dynamo, it does nothing (:data:`compiling` is a constant there, so even
    ``fullgraph=True`` sees no break). torch < 2.3's dynamo also calls it on fake tensors (to learn
    a module's outputs), where it does nothing either, and compiles every Python frame called while
    a compiled model runs: once torch._dynamo is loaded, npu_migrate's other files join its skip
    list (``torch._dynamo.skipfiles``), so what the hook calls runs as plain Python. torch._dynamo
    is never imported for that: a process that loaded none compiled nothing.
    """

    @functools.wraps(hook)
    def run(*args: Any) -> None:
        if compiling():
            return None
        if OLD_DYNAMO and "torch._dynamo" in sys.modules:
            _skip_in_dynamo()
            fake = getattr(sys.modules.get("torch._subclasses.fake_tensor"), "FakeTensor", None)
            if fake is not None and any(isinstance(t, fake) for _, t in tensors_in(args[1], "")):
                return None  # dynamo running a module on fake tensors to learn its outputs
        return hook(*args)

    return run


_SKIPPED: list[bool] = []


def _skip_in_dynamo() -> None:
    """Put npu_migrate's files on torch 2.1's dynamo skip list, once (newer torch: nothing to do)."""
    if _SKIPPED:
        return
    _SKIPPED.append(True)
    skipfiles = sys.modules.get("torch._dynamo.skipfiles")
    if skipfiles is not None and hasattr(skipfiles, "add"):
        for name in [n for n in sys.modules if n.split(".")[0] == "npu_migrate" and n != __name__]:
            if getattr(sys.modules[name], "__file__", None):
                skipfiles.add(name)


def tensors_in(value: Any, prefix: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """``(slot, tensor)`` for every strided tensor in ``value`` (tuples, lists, dicts, nested)."""
    if isinstance(value, torch.Tensor):
        if value.layout == torch.strided:
            yield prefix, value
    elif depth < _MAX_NEST and isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from tensors_in(item, f"{prefix}.{i}", depth + 1)
    elif depth < _MAX_NEST and isinstance(value, dict):
        for key, item in value.items():
            yield from tensors_in(item, f"{prefix}.{key}", depth + 1)


class ModuleHooks:
    """Per-module recording, mixed into :class:`~npu_migrate.compare.probe.Probe`."""

    # Set by Probe.__init__: the settings, this rank, optimizer steps done, the names seen.
    settings: ProbeSettings
    _pattern: re.Pattern[str] | None
    _modules_level: bool
    _rank: int
    _world_size: int
    _step: int
    _module_records: int
    _compiled_forwards: int
    _names: weakref.WeakKeyDictionary
    _selected_names: dict[str, bool]
    _layouts: dict[tuple, int]
    _hooked_params: dict[int, Any]
    _param_handles: list[Any]
    # Set by Probe._reset_step, once per optimizer step.
    _calls: dict[str, int]
    _grad_calls: dict[tuple[str, str], int]
    _entries: list[tuple[str, int, str, str, str, tuple[int, ...]]]
    _stats: list[torch.Tensor]
    _stack: list[tuple[Any, ...]]
    _last: tuple[torch.Tensor, int, torch.Tensor] | None

    def _open(self) -> bool:
        raise NotImplementedError

    def _live(self) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------ selection

    def _rank_selected(self) -> bool:
        return self.settings.ranks is None or self._rank in self.settings.ranks

    def _selected(self, name: str) -> bool:
        chosen = self._selected_names.get(name)
        if chosen is None:
            chosen = self._pattern is None or bool(self._pattern.search(name))
            self._selected_names[name] = chosen
        return chosen and (self._step + 1) in self.settings.steps and self._rank_selected()

    def _unmatched(self) -> list[str]:
        if not self._modules_level or self._module_records:
            return []
        if not self._rank_selected():
            return [f"--probe-ranks {','.join(map(str, self.settings.ranks or ()))} does not include rank "
                    f"{self._rank} of {self._world_size}"]
        names = sorted(self._selected_names)
        if self._pattern is not None and names and not any(self._selected_names.values()):
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            return [f"--probe-modules {self.settings.modules!r} matched none of the {len(names)} modules ({shown})"]
        if names and self._step:
            return [f"--probe-steps {self.settings.steps} matched none of the {self._step} optimizer step(s) run"]
        if self._compiled_forwards:
            return [COMPILED_ONLY]
        return ["no module ran forward with gradients enabled"]

    def _take_modules(self, step: int) -> ModuleStats | None:
        """This step's module statistics, stacked on their devices (one tensor per device and dtype)."""
        if not self._entries:
            return None
        entries, stats = tuple(self._entries), self._stats
        self._entries, self._stats = [], []
        groups: dict[tuple[Any, Any], list[int]] = {}
        for i, s in enumerate(stats):
            groups.setdefault((s.device, s.dtype), []).append(i)
        layout_id = self._layouts.get(entries)
        layout = None
        if layout_id is None:
            layout_id = self._layouts[entries] = len(self._layouts)
            layout = records.layout_line(layout_id, entries)
        self._module_records += len(entries)
        return ModuleStats(step, layout_id, layout, len(stats),
                           [(idx, torch.stack([stats[i] for i in idx])) for idx in groups.values()])

    # ------------------------------------------------------------------ per module

    def _name_tree(self, root: torch.nn.Module) -> None:
        inner = unwrapped(root)
        if inner is not root:
            self._names[root] = ""
        base = type(inner).__name__
        for name, module in inner.named_modules():
            if module not in self._names:
                self._names[module] = name or base

    def _name(self, module: torch.nn.Module) -> str:
        name = self._names.get(module)
        if name is None:
            root = self._stack[0][0] if self._stack else module
            self._name_tree(root)
            name = self._names.get(module)
            if name is None:  # created during forward, or called by a module it does not belong to
                parent = self._stack[-1][1] if self._stack else ""
                name = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
                self._names[module] = name
        return name

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        """The forward pre-hook's part for ``--probe-level modules``: the call's inputs, summarised now."""
        name = self._name(module)
        if not name or not self._selected(name):
            self._stack.append((module, name, -1, None))
            return None
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        inputs = [(slot, t, self._stats_of(t)) for slot, t in tensors_in(tuple(args), "input")]
        self._stack.append((module, name, call, inputs))
        return None

    def _modules_off(self) -> bool:
        """torch < 2.3, once a compiled model ran: its dynamo fails (an AssertionError in the user's
        forward) where module hooks register tensor hooks around compiled regions, so per-module
        records stop (the end record says why); steps are still recorded."""
        return OLD_DYNAMO and self._compiled_forwards > 0

    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if compiling() or self._modules_off() or not torch.is_grad_enabled() or not self._stack:
            return None  # inside a compiled region the hook is not traced into the graph
        while self._stack:  # frames of forwards that raised are dropped
            frame = self._stack.pop()
            if frame[0] is module:
                break
        else:
            return None
        _, name, call, inputs = frame
        if inputs is None:
            return None
        for slot, t, stats in inputs:
            self._add(name, call, "forward", slot, t.dtype, tuple(t.shape), stats)
        for slot, t in tensors_in(output, "output"):
            self._add(name, call, "forward", slot, t.dtype, tuple(t.shape), self._stats_of(t))
            if t.requires_grad:
                t.register_hook(functools.partial(self._grad_hook, name, call, "grad_" + slot, self._step))
        for slot, t, _ in inputs:
            if t.requires_grad:
                t.register_hook(functools.partial(self._grad_hook, name, call, "grad_" + slot, self._step))
        for pname, param in module._parameters.items():  # named_parameters(recurse=False) without its generator
            if param is None:
                continue
            known = self._hooked_params.get(id(param))
            if param.requires_grad and (known is None or known() is not param):
                self._hooked_params[id(param)] = weakref.ref(param)
                self._param_handles.append(param.register_hook(
                    functools.partial(self._param_hook, weakref.ref(module), "grad." + pname)))
        return None

    def _stats_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """:func:`tensor_stats`, reused when the same tensor, unchanged, was just summarised.

        One module's output is often the next one's input, and the two gradient hooks on it get
        the same gradient. Only the latest tensor is remembered (until the next one, or the step's
        end), so at most one tensor outlives its use a little.
        """
        if tensor.is_inference():  # made under torch.inference_mode: no version counter to trust
            return tensor_stats(tensor)
        last = self._last
        version = tensor._version
        if last is not None and last[0] is tensor and last[1] == version:
            return last[2]
        stats = tensor_stats(tensor)
        self._last = (tensor, version, stats)
        return stats

    def _add(self, name: str, call: int, phase: str, slot: str, dtype: torch.dtype, shape: tuple[int, ...],
             stats: torch.Tensor) -> None:
        self._entries.append((name, call, phase, slot, dtype_name(dtype), shape))
        self._stats.append(stats)

    def _grad_hook(self, name: str, call: int, slot: str, step: int, grad: torch.Tensor) -> None:
        if self._live() and step == self._step and grad is not None:
            self._add(name, call, "backward", slot, grad.dtype, tuple(grad.shape), self._stats_of(grad))

    def _param_hook(self, module_ref: Any, slot: str, grad: torch.Tensor) -> None:
        module = module_ref()
        if not self._live() or module is None or grad is None:
            return
        name = self._names.get(module)
        if not name or not self._selected(name) or not self._open():
            return
        count = self._grad_calls.get((name, slot), 0)
        self._grad_calls[(name, slot)] = count + 1
        self._add(name, count, "backward", slot, grad.dtype, tuple(grad.shape), tensor_stats(grad))
