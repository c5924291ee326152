"""The probe's per-module hooks (``--probe-level modules``): module names, selection, each call's tensors.

Usage (by :class:`~npu_migrate.compare.recording.probe.Probe`, which holds one as ``probe.modules``)::

    modules = ModuleHooks(settings, position, live=probe._live, opened=probe._open)
    register_module_forward_hook(outside_compile(modules.forward_post))   # with the probe's pre-hook
    modules.enter(module, args)          # from the probe's forward pre-hook: the call's inputs
    stats = modules.take(step)           # at the step's end: a ModuleStats, or None
    modules.reset_step()

:class:`ModuleHooks` names every module once (its path in the model the first forward comes from),
selects names with ``--probe-modules``, ``--probe-steps`` and ``--probe-ranks``, and summarises
(:func:`~npu_migrate.compare.recording.stats.tensor_stats`) each selected call's inputs and outputs in the
forward pass and their gradients and the parameters' in the backward pass. A step's summaries are
stacked into one :class:`~npu_migrate.compare.recording.stats.ModuleStats` per step (:meth:`ModuleHooks.take`).
It reads the probe's rank and step from a :class:`Position` that the probe writes.
"""

from __future__ import annotations

import functools
import re
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from npu_migrate.compare import records
from npu_migrate.compare.recording.settings import COMPILED_ONLY, ProbeSettings
from npu_migrate.compare.recording.stats import ModuleStats, dtype_name, tensor_stats

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


@dataclass
class Position:
    """Where a probe's recording is: its rank, the world's size, optimizer steps done (the probe writes it)."""

    rank: int = 0
    world_size: int = 1
    step: int = 0


class ModuleHooks:
    """Per-module recording (``--probe-level modules``), held by a :class:`~npu_migrate.compare.recording.probe.Probe`.

    Args:
        settings: the probe's settings (``modules``, ``steps``, ``ranks``, ``level``).
        position: the probe's rank, world size and steps done, read as they change.
        live: whether the owning probe is the one recording (hooks of a stopped probe may still fire).
        opened: whether this process records (the probe opens its rank file at the first record).
    """

    def __init__(self, settings: ProbeSettings, position: Position, live: Callable[[], bool],
                 opened: Callable[[], bool]) -> None:
        self.settings = settings
        self.position = position
        self._live = live
        self._open = opened
        self.pattern = re.compile(settings.modules) if settings.modules else None
        self.enabled = settings.level == "modules"
        self.records = 0  # module records taken so far
        self.compiled_forwards = 0  # calls of a torch.compile'd model: its modules are not recorded
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.selected_names: dict[str, bool] = {}
        self._layouts: dict[tuple, int] = {}
        self._hooked_params: dict[int, Any] = {}  # id -> weakref (tensors compare by value, not identity)
        self.param_handles: list[Any] = []
        self.reset_step()

    def reset_step(self) -> None:
        """A new optimizer step: no call counted, nothing summarised yet."""
        self._calls: dict[str, int] = {}
        self._grad_calls: dict[tuple[str, str], int] = {}
        self._entries: list[tuple[str, int, str, str, str, tuple[int, ...]]] = []
        self._stats: list[torch.Tensor] = []
        self.stack: list[tuple[Any, ...]] = []
        self._last: tuple[torch.Tensor, int, torch.Tensor] | None = None

    # ------------------------------------------------------------------ selection

    def rank_selected(self) -> bool:
        return self.settings.ranks is None or self.position.rank in self.settings.ranks

    def _selected(self, name: str) -> bool:
        chosen = self.selected_names.get(name)
        if chosen is None:
            chosen = self.pattern is None or bool(self.pattern.search(name))
            self.selected_names[name] = chosen
        return chosen and (self.position.step + 1) in self.settings.steps and self.rank_selected()

    def unmatched(self) -> list[str]:
        """Why nothing was recorded per module (a filter that matched nothing), or []."""
        position = self.position
        if not self.enabled or self.records:
            return []
        if not self.rank_selected():
            return [f"--probe-ranks {','.join(map(str, self.settings.ranks or ()))} does not include rank "
                    f"{position.rank} of {position.world_size}"]
        names = sorted(self.selected_names)
        if self.pattern is not None and names and not any(self.selected_names.values()):
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            return [f"--probe-modules {self.settings.modules!r} matched none of the {len(names)} modules ({shown})"]
        if names and position.step:
            return [f"--probe-steps {self.settings.steps} matched none of the {position.step} optimizer step(s) run"]
        if self.compiled_forwards:
            return [COMPILED_ONLY]
        return ["no module ran forward with gradients enabled"]

    def take(self, step: int) -> ModuleStats | None:
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
        self.records += len(entries)
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
            root = self.stack[0][0] if self.stack else module
            self._name_tree(root)
            name = self._names.get(module)
            if name is None:  # created during forward, or called by a module it does not belong to
                parent = self.stack[-1][1] if self.stack else ""
                name = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
                self._names[module] = name
        return name

    def enter(self, module: torch.nn.Module, args: Any) -> None:
        """The forward pre-hook's part for ``--probe-level modules``: the call's inputs, summarised now."""
        name = self._name(module)
        if not name or not self._selected(name):
            self.stack.append((module, name, -1, None))
            return None
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        inputs = [(slot, t, self._stats_of(t)) for slot, t in tensors_in(tuple(args), "input")]
        self.stack.append((module, name, call, inputs))
        return None

    def off(self) -> bool:
        """torch < 2.3, once a compiled model ran: its dynamo fails (an AssertionError in the user's
        forward) where module hooks register tensor hooks around compiled regions, so per-module
        records stop (the end record says why); steps are still recorded."""
        return OLD_DYNAMO and self.compiled_forwards > 0

    def forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """The global forward hook: the call's outputs, and hooks for its gradients."""
        if compiling() or self.off() or not torch.is_grad_enabled() or not self.stack:
            return None  # inside a compiled region the hook is not traced into the graph
        while self.stack:  # frames of forwards that raised are dropped
            frame = self.stack.pop()
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
                t.register_hook(functools.partial(self._grad_hook, name, call, "grad_" + slot, self.position.step))
        for slot, t, _ in inputs:
            if t.requires_grad:
                t.register_hook(functools.partial(self._grad_hook, name, call, "grad_" + slot, self.position.step))
        for pname, param in module._parameters.items():  # named_parameters(recurse=False) without its generator
            if param is None:
                continue
            known = self._hooked_params.get(id(param))
            if param.requires_grad and (known is None or known() is not param):
                self._hooked_params[id(param)] = weakref.ref(param)
                self.param_handles.append(param.register_hook(
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
        if self._live() and step == self.position.step and grad is not None:
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
