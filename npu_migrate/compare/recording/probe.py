"""Recording a training run for ``npu-migrate compare``, with torch's global hooks and no code changes.

Usage::

    python -m npu_migrate.launch --device-num 2 --probe runs/gpu train.py       # every rank records
    npu-migrate run --probe runs/npu --probe-level modules train.py

    from npu_migrate.compare import Probe                                       # or from a script
    with Probe("runs/cpu", level="modules", modules=r"layer\\d"):
        train()

What records what (nothing of torch's math is wrapped, so ``from torch import relu``, type checks
and ``torch.compile`` see torch's own functions):

* a wrapper of ``torch.Tensor.backward`` keeps the scalar each backward pass starts from (the loss);
* a watch on every optimizer's ``step`` (:mod:`npu_migrate.optim_steps`, not torch's own step
  hooks, which torch 2.1 turns off for good at the first ``torch.compile``) takes the gradient norm
  and the learning rate before each optimizer step and writes the step's record after it;
* ``torch.nn.modules.module.register_module_forward_pre_hook`` / ``..._forward_hook`` take every
  module's inputs and outputs in training forwards (gradients enabled), and tensor hooks on them
  and on parameters take the backward gradients (``--probe-level modules``). The same pre-hook
  notes autocast, loads or saves the seed checkpoint and turns dropout off on request.

Statistics are computed on the device in float32 (float64 for float64 tensors), right where each
tensor is seen (one hook call, a few reductions, nothing fetched), stacked once per step, and
fetched once per step by whoever writes. Records are appended to ``DIR/rank{R}.jsonl`` as each
step ends (see :mod:`npu_migrate.compare.records`) by :mod:`npu_migrate.compare.recording.writer`: on the
CPU in the training thread, so a crash keeps every finished step; on an accelerator by a writer
thread that waits for the device, so training never does (a process killed outright may lose the
last step or two; any exit that runs ``atexit`` or multiprocessing's finalizers writes them).
"""

from __future__ import annotations

import atexit
import functools
import io
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import torch

from npu_migrate import fileio, optim_steps, redact
from npu_migrate.compare import records
from npu_migrate.compare.recording.module_hooks import ModuleHooks, Position, compiling, is_compiled, outside_compile, unwrapped
from npu_migrate.compare.recording.settings import ProbeError, ProbeSettings, StepRange, parse_ranks
from npu_migrate.compare.recording.stats import autocast_dtype, dtype_name, fenced, float32_math, step_records
from npu_migrate.compare.recording.writer import DeviceFence, RecordWriter

logger = logging.getLogger(__name__)

_ACTIVE: Probe | None = None
_ORIGINAL_BACKWARD = None


def _patched_backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    probe = _ACTIVE
    if probe is not None and tensor.numel() == 1:
        probe._note_loss(tensor)
    return _ORIGINAL_BACKWARD(tensor, *args, **kwargs)  # type: ignore[misc]


class Probe:
    """Records this process's training to ``DIR/rank{R}.jsonl`` while started.

    Its per-module hooks (``level="modules"``) are a :class:`~npu_migrate.compare.recording.module_hooks.ModuleHooks`
    it holds (``self.modules``), which reads the rank and step from the probe's :class:`.Position`.

    Args:
        directory: a directory, or complete :class:`ProbeSettings`.
        level: ``steps`` or ``modules``.
        modules: regular expression selecting module names (``--probe-level modules``).
        steps: optimizer steps whose module records are kept, e.g. ``"10:20"``.
        ranks: ranks that record modules, e.g. ``"0"`` or ``(0, 1)``.
        append: add to an existing rank file instead of refusing it.
        seed_checkpoint: initial weights saved there by the first run and loaded by later ones.
        no_dropout: set every dropout module's probability to 0.

    Raises:
        ProbeError: bad settings, or (at the first record) a rank file that exists without
            ``append``.
    """

    def __init__(self, directory: str | ProbeSettings, *, level: str = "steps", modules: str | None = None,
                 steps: str | None = None, ranks: str | tuple[int, ...] | None = None, append: bool = False,
                 seed_checkpoint: str | None = None, no_dropout: bool = False, _managed: bool = False) -> None:
        if isinstance(directory, ProbeSettings):
            self.settings = directory
        else:
            self.settings = ProbeSettings(
                directory=str(directory), level=level, modules=modules,  # type: ignore[arg-type]
                steps=StepRange.parse(steps), ranks=parse_ranks(ranks) if isinstance(ranks, (str, type(None)))
                else tuple(sorted(ranks)), append=append, seed_checkpoint=seed_checkpoint, no_dropout=no_dropout)
        self._managed = _managed  # armed by a launcher, which already checked the directory
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._writer: RecordWriter | None = None
        self._pid: int | None = None
        self._position = Position()  # rank, world size, optimizer steps done: written here, read by the hooks
        self.modules = ModuleHooks(self.settings, self._position, live=self._live, opened=self._open)
        self._device_type = "cpu"
        self._closed = False
        self._seed_done = not self.settings.seed_checkpoint
        self._seen_steps_with_modules = 0
        self._warned_pattern = False
        self._reset_step()

    # ------------------------------------------------------------------ lifecycle

    def _live(self) -> bool:
        """This probe is the one recording (hooks of a stopped probe may still fire)."""
        return _ACTIVE is self

    def start(self) -> Probe:
        """Install the hooks (once per process).

        Raises:
            ProbeError: another probe is recording in this process.
        """
        global _ACTIVE, _ORIGINAL_BACKWARD
        if _ACTIVE is not None:
            raise ProbeError(f"a probe is already recording to {_ACTIVE.settings.directory!r} in this process; "
                             "stop it first (one recording per process).")
        from torch.nn.modules import module as nn_module

        self._handles = [
            optim_steps.watch(before=self._before_step, after=self._after_step),
            nn_module.register_module_forward_pre_hook(outside_compile(self._forward_pre)),
        ]
        if self.modules.enabled:
            self._handles.append(nn_module.register_module_forward_hook(outside_compile(self.modules.forward_post)))
        _ORIGINAL_BACKWARD = torch.Tensor.backward
        torch.Tensor.backward = functools.wraps(_ORIGINAL_BACKWARD)(_patched_backward)  # type: ignore[method-assign]
        _ACTIVE = self
        return self

    def stop(self) -> None:
        """Write what is pending and the ``end`` record, then remove every hook.

        Raises:
            ProbeError: module records were asked for and a filter matched nothing.
        """
        global _ACTIVE, _ORIGINAL_BACKWARD
        reasons = self.close()
        for handle in self._handles + self.modules.param_handles:
            handle.remove()
        self._handles, self.modules.param_handles = [], []
        if _ACTIVE is self:
            if _ORIGINAL_BACKWARD is not None:
                torch.Tensor.backward = _ORIGINAL_BACKWARD  # type: ignore[method-assign]
            _ACTIVE, _ORIGINAL_BACKWARD = None, None
        if reasons:
            raise ProbeError(f"--probe {self.settings.directory}: {'; '.join(reasons)}. Nothing was recorded per "
                             "module: check the module pattern, step range and ranks.")

    def __enter__(self) -> Probe:
        return self.start()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.stop()
        else:
            try:
                self.stop()
            except ProbeError:
                pass  # the exception in flight says more

    def close(self) -> list[str]:
        """Flush pending module statistics and write the ``end`` record; return unmatched-filter reasons."""
        with self._lock:
            if self._closed or self._writer is None or self._pid != os.getpid():
                return []
            self._closed = True
            try:
                modules = self.modules.take(self._position.step + 1)
                if modules is not None:
                    fence = DeviceFence.create(self._device_type) if self._writer.threaded else None
                    self._writer.put(functools.partial(fenced, fence, modules))
            except Exception as exc:  # noqa: BLE001 - at exit, keep what is there
                logger.warning("probe: could not write the last module statistics: %s", exc)
            reasons = self.modules.unmatched()
            try:
                self._writer.put({"kind": "end", "time": time.time(), "steps": self._position.step,
                                  "level": self.settings.level, "module_records": self.modules.records,
                                  "unmatched": reasons})
            finally:
                self._writer.close()  # every pending record written, the writer thread joined
            return reasons if self.modules.rank_selected() else []

    # ------------------------------------------------------------------ the file

    def _open(self) -> bool:
        """Open this rank's file and write the header at the first record; False in processes that must not record."""
        if self._writer is not None:
            return self._pid == os.getpid() and not self._closed
        if self._closed:
            return False
        info = torch.utils.data.get_worker_info()
        if info is not None:  # a DataLoader worker: never the training process
            return False
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self._position.rank, self._position.world_size = dist.get_rank(), dist.get_world_size()
        else:
            self._position.rank = int(os.environ.get("RANK", "0"))
            self._position.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        os.makedirs(self.settings.directory, exist_ok=True)
        path = os.path.join(self.settings.directory, f"rank{self._position.rank}.jsonl")
        if os.path.exists(path) and not (self.settings.append or self._managed):
            self._closed = True
            raise ProbeError(f"probe file {path!r} already exists; nothing was overwritten. Choose a new directory, "
                             "or pass append=True (--probe-append) to add to it.")
        # private (0600), and never appended through a symlink planted at the name
        try:
            fh = os.fdopen(fileio.open_private_append(path), "ab")
        except OSError as exc:
            self._closed = True
            link = " (it is a symlink: probe files are never written through one)" if os.path.islink(path) else ""
            raise ProbeError(f"probe file {path!r} cannot be opened: {exc.strerror or exc}{link}. Choose a "
                             "directory of your own for --probe.") from exc
        self._pid = os.getpid()
        self._device_type, device_name = self._device()
        # On an accelerator a thread writes, so that the training thread never waits for the device's
        # values; on the CPU they are ready, and each step is on disk when the step ends.
        self._writer = RecordWriter(fh, threaded=DeviceFence.create(self._device_type) is not None)
        torch_npu = sys.modules.get("torch_npu")
        from npu_migrate import __version__

        self._writer.put({
            "kind": "header", "format": records.FORMAT, "rank": self._position.rank, "world_size": self._position.world_size,
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "node_rank": int(os.environ.get("NODE_RANK", "0")),
            "host": socket.gethostname(), "pid": self._pid, "time": time.time(),
            "device": self._device_type, "device_name": device_name,
            "default_dtype": dtype_name(torch.get_default_dtype()), "seed": torch.initial_seed(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                         "torch_npu": getattr(torch_npu, "__version__", None), "npu_migrate": __version__},
            "settings": self.settings.describe(), "stat_fields": list(records.STAT_FIELDS),
            "argv": redact.argv(sys.argv),  # recordings are copied between machines: no secrets in them
        })  # the writer passes a header through redact.value
        # Workers of the launcher and of multiprocessing leave through os._exit, which skips atexit;
        # multiprocessing runs its own finalizers first.
        atexit.register(self.close)
        try:
            import multiprocessing.util

            multiprocessing.util.Finalize(None, self.close, exitpriority=100)
        except Exception:  # noqa: BLE001 - atexit is enough in a plain process
            pass
        return True

    @staticmethod
    def _device() -> tuple[str, str | None]:
        try:
            from npu_migrate import device as nm_device

            return nm_device.device_type(), nm_device.device_name()
        except Exception:  # noqa: BLE001 - the header says what it can
            return ("cuda" if torch.cuda.is_available() else "cpu"), None

    # ------------------------------------------------------------------ per step

    def _reset_step(self) -> None:
        self._losses: list[torch.Tensor] = []
        self._grad_parts: list[torch.Tensor] = []
        self._lr: float | None = None
        self._autocast: str | None = None
        self._float32: str | None = None
        self._float32_read = False  # once per step: the forward pre-hook is a hot path
        self.modules.reset_step()

    def _note_loss(self, tensor: torch.Tensor) -> None:
        if self._open():
            self._losses.append(tensor.detach().reshape(()).clone())

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._open():
            return
        grads: dict[torch.device, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    grad = grad.coalesce()._values()
                g = grad.detach()
                grads.setdefault(g.device, []).append(torch.linalg.vector_norm(g if g.dtype == torch.float64 else g.float()))
        # Kept on the device: the writer turns them into the record (:func:`.stats.step_records`).
        self._grad_parts = [torch.linalg.vector_norm(torch.stack(norms)) for norms in grads.values()]
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        self._lr = float(lr) if lr is not None else None

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._open():
            return
        with self._lock:
            step = self._position.step + 1
            modules = self.modules.take(step)
            fence = DeviceFence.create(self._device_type) if self._writer.threaded else None
            self._writer.put(functools.partial(step_records, fence, step, self._losses, self._grad_parts, self._lr,
                                               self._autocast, modules, self._float32))
            self._position.step = step
            hooks = self.modules
            if hooks.enabled and hooks.pattern is not None and not self._warned_pattern and hooks.selected_names \
                    and not any(hooks.selected_names.values()) and hooks.rank_selected():
                self._warned_pattern = True
                names = sorted(hooks.selected_names)
                print(f"npu-migrate probe: warning: --probe-modules {self.settings.modules!r} matched none of the "
                      f"{len(names)} modules seen in step {step} ({', '.join(names[:8])}); this will be an error "
                      "at exit", file=sys.stderr, flush=True)
            self._reset_step()

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if compiling() or not torch.is_grad_enabled():
            # Evaluation and no_grad forwards are not part of a training step; inside a compiled
            # region dynamo would trace the hook into the graph (or fail on it, fullgraph=True).
            return None
        if is_compiled(module):  # its own call runs eagerly; the modules inside run compiled
            self.modules.compiled_forwards += 1
        if not self._seed_done and not self.modules.stack:
            self._seed(module)
        if self.settings.no_dropout and isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p:
            module.p = 0.0
        if self._autocast is None:
            self._autocast = autocast_dtype(self._device_type)
        if not self._float32_read:
            self._float32, self._float32_read = float32_math(self._device_type), True
        if not self.modules.enabled or self.modules.off():
            return None
        if not self._open():
            return None
        return self.modules.enter(module, args)

    # ------------------------------------------------------------------ comparable runs

    def _seed(self, root: torch.nn.Module) -> None:
        model = unwrapped(root)
        if not any(True for _ in model.parameters()):
            return
        self._seed_done = True
        if not self._open():
            return
        path = str(self.settings.seed_checkpoint)
        mode = self.settings.seed_mode or ("load" if os.path.exists(path) else "save")
        if mode == "load":
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
            except FileNotFoundError as exc:
                raise ProbeError(f"--probe-seed-checkpoint {path!r} is gone: it existed when the job started. "
                                 "Keep the file, or delete it on purpose to save a new one.") from exc
            try:
                with torch.no_grad():
                    model.load_state_dict(state)
            except RuntimeError as exc:
                first = " ".join(str(exc).split())[:300]
                raise ProbeError(f"--probe-seed-checkpoint {path!r} does not fit {type(model).__name__}: {first}. "
                                 "It must come from the same model; delete it to save a new one.") from exc
            logger.info("probe: initial weights of %s loaded from %s", type(model).__name__, path)
        elif self._position.rank == 0:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            buffer = io.BytesIO()
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
            fileio.write_atomic(path, buffer.getvalue(), mode=fileio.default_mode())
            logger.info("probe: initial weights of %s saved to %s", type(model).__name__, path)


def install_from_env() -> Probe | None:
    """Start the probe a launcher exported (``NPU_MIGRATE_PROBE``...); ``None`` when none was."""
    settings = ProbeSettings.from_env()
    if settings is None or _ACTIVE is not None:
        return _ACTIVE
    return Probe(settings, _managed=True).start()


def active() -> Probe | None:
    """The probe recording in this process, if any."""
    return _ACTIVE

