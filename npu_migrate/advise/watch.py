"""What ``npu-migrate advise`` watches while the audit records: forwards, optimizers, DataLoaders, syncs.

Usage::

    from npu_migrate.advise.watch import Watch

    with recorder, Watch(recorder) as seen:      # npu_migrate.ops.record.Recorder, already entered
        run_the_script()
    seen.matcher.found, seen.optimizers, seen.loaders, seen.syncs, seen.empty_cache, seen.anomaly

It is the recorder's ``observer`` (every recorded call and host sync comes to it) and, for the run,
patches a few constructors and functions lightly, each to note its call and the user's line:

* module forward hooks keep the stack of modules running; the calls of the forward phase go to the
  :class:`npu_migrate.advise.fusion.Matcher` with the class of the innermost one;
* ``torch.optim.Optimizer.__init__``: the class and its ``fused``/``foreach`` defaults;
* ``torch.utils.data.DataLoader.__init__``: ``num_workers``, ``pin_memory`` as asked, and (for a loader
  without workers, through its ``collate_fn``) whether its batches are on the device already;
* ``torch.nn.utils.clip_grad_norm_``: its ``foreach``;
* ``SyncBatchNorm``: layers made, and BatchNorm layers ``convert_sync_batchnorm`` is asked to convert
  (on the CPU, migration keeps them BatchNorm); DistributedDataParallel forwards that will all-reduce
  gradients (not under ``no_sync()``) are counted per optimizer step;
* ``torch.cuda.empty_cache`` (the migrated one) and ``torch.set_anomaly_enabled``: where they are called.

Host syncs and ``empty_cache`` calls are kept with the optimizer steps they fell in, so that one in
every step is told from one at start-up; nothing before the first module forward counts.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from npu_migrate.advise.fusion import Matcher
from npu_migrate.migrate import callers


def user_site() -> str:
    """``file:line`` of the nearest frame in user code."""
    frame = sys._getframe(1)
    while frame is not None and callers.is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _tensors_in(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors of a batch: a tensor, or lists, tuples and dicts of them (three levels)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth < 3 and isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return [t for item in items for t in _tensors_in(item, depth + 1)]
    return []


@dataclass
class Seen:
    """Calls at one site: how many, and in which optimizer-step intervals (0: before the first step)."""

    count: int = 0
    intervals: set[int] = field(default_factory=set)
    what: str = ""


class Watch:
    """The recorder's observer and the run's light patches; see the module docstring."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.modules: list[str] = []
        self.matcher = Matcher(lambda: self.modules[-1] if self.modules else "",
                               in_mha=lambda: self.mha_depth > 0)
        self.mha_depth = 0  # torch's nn.MultiheadAttention forwards running
        self.started = False  # a module forward has run
        self.optimizers: dict[str, dict[str, Any]] = {}  # site -> {"kind", "fused", "foreach"}
        self.loaders: dict[str, dict[str, Any]] = {}      # site -> {"num_workers", "pin_memory"}
        self.clips: dict[str, dict[str, Any]] = {}        # site -> {"foreach"}
        self.syncs: dict[tuple[str, str], Seen] = {}
        self.empty_cache: dict[str, Seen] = {}
        self.anomaly: str | None = None  # where anomaly detection was turned on ("" if not seen where)
        self.blocking_copies: dict[str, Seen] = {}       # site -> host-to-device copies without non_blocking
        self.anomaly_syncs: dict[str, Seen] = {}          # backward site -> its NaN checks' host syncs
        self.sync_batchnorm: dict[str, int] = {}          # site -> SyncBatchNorm layers made there
        self.ddp_forwards: dict[str, Seen] = {}          # forward site -> DDP forwards that sync gradients
        self._undo: list[Callable[[], None]] = []
        self._converting = False

    # -- the recorder's observer ----------------------------------------------------------------------
    def op(self, name: str, overload: str, phase: str, site: str, function: str, via: tuple,
           inputs: list[Any], outputs: list[Any]) -> None:
        if phase == "forward" and not via:
            self.matcher.op(name, overload, site, function, inputs, outputs)

    def host_copy(self, site: str, blocking: bool) -> None:
        """A host tensor sent to the device with ``.to(device)`` (``blocking``: without non_blocking=True)."""
        if self.started and blocking:
            self._note(self.blocking_copies, site, "Tensor.to(device)")

    def sync(self, what: str, site: str) -> None:
        if not self.started:
            return
        if (what == "aten::_local_scalar_dense" and torch.is_anomaly_enabled()
                and self.recorder.phase() == "backward"):
            # The autograd engine's NaN check of each gradient under anomaly detection: the cure is
            # anomaly detection off (its advice counts them), not a change at the backward's line.
            self._note(self.anomaly_syncs, site, what)
            return
        self._note(self.syncs, (what, site), what)

    def _note(self, table: dict, key: Any, what: str = "") -> None:
        seen = table.get(key)
        if seen is None:
            seen = table[key] = Seen(what=what)
        seen.count += 1
        seen.intervals.add(self.recorder.steps_done)

    # -- patches ---------------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> "Watch":
        check_nan = getattr(torch, "is_anomaly_check_nan_enabled", lambda: True)
        anomaly = (torch.is_anomaly_enabled(), check_nan())
        self._undo.append(lambda: torch.set_anomaly_enabled(*anomaly))  # a script's global switch ends with it
        self.recorder.observer = self
        self._undo.append(lambda: setattr(self.recorder, "observer", None))
        module = torch.nn.modules.module

        ddp_class = getattr(torch.nn.parallel, "DistributedDataParallel", None)

        def pre(mod: Any, inputs: Any) -> None:
            if not self.modules and torch.is_anomaly_enabled() and self.anomaly is None:
                self.anomaly = ""
            if ddp_class is not None and isinstance(mod, ddp_class) and torch.is_grad_enabled() \
                    and getattr(mod, "require_backward_grad_sync", True):
                self._note(self.ddp_forwards, user_site())
            self.started = True
            self.modules.append(type(mod).__name__)
            if isinstance(mod, torch.nn.MultiheadAttention):
                self.mha_depth += 1

        def post(mod: Any, inputs: Any, output: Any) -> None:
            if self.modules:
                self.modules.pop()
            if isinstance(mod, torch.nn.MultiheadAttention) and self.mha_depth:
                self.mha_depth -= 1

        handles = [module.register_module_forward_pre_hook(pre),
                   module.register_module_forward_hook(post, always_call=True)]
        self._undo.extend(h.remove for h in handles)
        self._patch(torch.optim.Optimizer, "__init__", self._optimizer_init)
        self._patch(torch.utils.data.DataLoader, "__init__", self._loader_init)
        for owner in (torch.nn.utils, torch.nn.utils.clip_grad):
            if hasattr(owner, "clip_grad_norm_"):
                self._patch(owner, "clip_grad_norm_", self._clip)
        if hasattr(torch.cuda, "empty_cache"):
            self._patch(torch.cuda, "empty_cache", self._empty_cache)
        self._patch(torch, "set_anomaly_enabled", self._anomaly)
        sync_bn = torch.nn.SyncBatchNorm
        self._patch(sync_bn, "__init__", self._sync_bn_init)
        bound = sync_bn.convert_sync_batchnorm  # a classmethod (a staticmethod once migration replaced it)
        self._patch(sync_bn, "convert_sync_batchnorm", lambda original: staticmethod(self._convert(bound)))
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()

    def _optimizer_init(self, original: Any) -> Any:
        def __init__(opt: Any, params: Any, defaults: dict, *args: Any, **kwargs: Any) -> None:
            original(opt, params, defaults, *args, **kwargs)
            kind = type(opt)
            if kind.__module__.startswith("torch.optim"):
                self.optimizers.setdefault(user_site(), {"kind": kind.__name__, "fused": defaults.get("fused"),
                                                         "foreach": defaults.get("foreach")})
        return __init__

    def _loader_init(self, original: Any) -> Any:
        signature = inspect.signature(original)

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            original(loader, *args, **kwargs)
            try:  # as asked: DataLoader turns pin_memory off itself where no accelerator is (this CPU)
                asked = signature.bind(loader, *args, **kwargs).arguments.get("pin_memory", False)
            except TypeError:
                asked = loader.pin_memory
            site = user_site()
            if site in self.loaders:
                return
            info = self.loaders[site] = {"num_workers": loader.num_workers, "pin_memory": bool(asked),
                                         "device_batches": False, "batches": 0}
            if loader.num_workers == 0:  # collated here: see whether its batches are on the device already
                loader.collate_fn = self._collate(loader.collate_fn, info)
        return __init__

    def _collate(self, collate: Any, info: dict[str, Any]) -> Any:
        def collate_fn(batch: Any) -> Any:
            out = collate(batch)
            info["batches"] += 1
            if not info["device_batches"]:
                info["device_batches"] = any(self.recorder.is_device(t) for t in _tensors_in(out))
            return out
        return collate_fn

    def _sync_bn_init(self, original: Any) -> Any:
        def __init__(layer: Any, *args: Any, **kwargs: Any) -> None:
            original(layer, *args, **kwargs)
            if not self._converting:
                site = user_site()
                self.sync_batchnorm[site] = self.sync_batchnorm.get(site, 0) + 1
        return __init__

    def _convert(self, bound: Any) -> Any:
        norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)

        def convert_sync_batchnorm(module: Any, *args: Any, **kwargs: Any) -> Any:
            count = sum(isinstance(m, norms) for m in module.modules()) if isinstance(module, torch.nn.Module) else 0
            if count:  # counted as asked: on the CPU, migration keeps the BatchNorm layers
                site = user_site()
                self.sync_batchnorm[site] = self.sync_batchnorm.get(site, 0) + count
            self._converting = True
            try:
                return bound(module, *args, **kwargs)
            finally:
                self._converting = False
        return convert_sync_batchnorm

    def _clip(self, original: Any) -> Any:
        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            self.clips.setdefault(user_site(), {"foreach": kwargs.get("foreach")})
            return original(*args, **kwargs)
        return clip_grad_norm_

    def _empty_cache(self, original: Any) -> Any:
        def empty_cache(*args: Any, **kwargs: Any) -> Any:
            if self.started:
                self._note(self.empty_cache, user_site())
            return original(*args, **kwargs)
        return empty_cache

    def _anomaly(self, original: Any) -> Any:
        def set_anomaly_enabled(enabled: bool, *args: Any, **kwargs: Any) -> Any:
            if enabled:
                self.anomaly = user_site()
            return original(enabled, *args, **kwargs)
        return set_anomaly_enabled
