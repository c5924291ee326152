"""Stand-in for ``torch_npu.profiler``: torch-npu's profiler API, recording with torch's CPU profiler.

The names and signatures are the real package's (torch-npu 2.14.0; tests/profiling/test_npu_surface.py
checks them, and every call npu_migrate makes, against the released wheels). What it simulates:
``profile`` with a ``schedule`` returning this module's :class:`ProfilerAction`, ``ProfilerStep#N``
ranges, ``start``/``step``/``stop``, ``step_num`` and ``current_action`` as the real class keeps
them; ``tensorboard_trace_handler(dir_name, worker_name)`` writing, as torch-npu's analysis does,
``{dir}/{worker}_{pid}_{time}_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json`` (a Chrome trace,
as a list of events) and ``operator_details.csv`` (its columns). What it cannot: device time
(the device columns are 0: the simulated device computes on the host), CANN's own files, the
experimental config's effects (it is checked and kept).
"""

from __future__ import annotations

import csv
import enum
import json
import os
import socket
import tempfile
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.autograd.profiler as _prof

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler", "schedule",
           "ProfilerAction", "_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem"]


class ProfilerActivity(enum.Enum):
    """torch_npu._C._profiler.ProfilerActivity."""

    CPU = 0
    NPU = 1


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Db = "db"
    Text = "text"


class HostSystem:
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"


def supported_activities() -> set:
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


def supported_profiler_level() -> set:
    return {ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2, ProfilerLevel.Level_none}


def supported_ai_core_metrics() -> set:
    return {v for k, v in vars(AiCMetrics).items() if not k.startswith("_")}


def supported_export_type() -> set:
    return {ExportType.Db, ExportType.Text}


class _ExperimentalConfig:
    def __init__(
        self,
        profiler_level: int = ProfilerLevel.Level0,
        aic_metrics: int = AiCMetrics.PipeUtilization,
        l2_cache: bool = False,
        msprof_tx: bool = False,
        mstx: bool = False,
        data_simplification: bool = True,
        record_op_args: bool = False,
        op_attr: bool = False,
        gc_detect_threshold: Optional[float] = None,
        export_type: Union[str, list] = ExportType.Text,
        host_sys: Optional[list] = None,
        mstx_domain_include: Optional[list] = None,
        mstx_domain_exclude: Optional[list] = None,
        sys_io: bool = False,
        sys_interconnection: bool = False,
    ):
        if profiler_level not in supported_profiler_level():
            raise ValueError(f"profiler_level {profiler_level!r} is not supported")
        if aic_metrics not in supported_ai_core_metrics():
            raise ValueError(f"aic_metrics {aic_metrics!r} is not supported")
        types = export_type if isinstance(export_type, list) else [export_type]
        if not set(types) <= supported_export_type():
            raise ValueError(f"export_type {export_type!r} is not supported")
        self._profiler_level, self._aic_metrics, self._l2_cache = profiler_level, aic_metrics, l2_cache
        self._data_simplification, self._export_type = data_simplification, types


class schedule:  # torch_npu.profiler.scheduler.Schedule, exported as schedule
    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0,
                 skip_first_wait: int = 0) -> None:
        self.wait, self.active, self.warmup, self.repeat, self.skip_first = wait, active, warmup, repeat, skip_first

    def __call__(self, step: int) -> ProfilerAction:
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step // cycle >= self.repeat:
            return ProfilerAction.NONE
        mod = step % cycle
        if mod < self.wait:
            return ProfilerAction.NONE
        if mod < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if mod < cycle - 1 else ProfilerAction.RECORD_AND_SAVE


_PATH: dict[str, Optional[str]] = {"dir": None, "worker": None}  # torch-npu's ProfPathCreator, a singleton


def tensorboard_trace_handler(dir_name: Optional[str] = None, worker_name: Optional[str] = None,
                              analyse_flag: bool = True, async_mode: bool = False):
    _PATH.update(dir=dir_name, worker=worker_name)

    def handler_fn(prof_inst) -> None:
        if analyse_flag:
            prof_inst._write_output()

    return handler_fn


OPERATOR_HEADERS = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                    "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
                    "Device Total Duration With AICore(us)"]


def _default_schedule_fn(_: int) -> ProfilerAction:
    return ProfilerAction.RECORD


class profile:
    def __init__(
        self,
        *,
        activities: Optional[Iterable[ProfilerActivity]] = None,
        schedule: Optional[Callable[[int], ProfilerAction]] = None,
        on_trace_ready: Optional[Callable[..., Any]] = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: Optional[_ExperimentalConfig] = None,
        execution_trace_observer: Any = None,
        custom_trace_id_callback: Optional[Callable[[], str]] = None,
        # deprecated:
        use_cuda: Optional[bool] = None,
    ):
        if experimental_config is not None and not isinstance(experimental_config, _ExperimentalConfig):
            raise TypeError("experimental_config must be a torch_npu.profiler._ExperimentalConfig")
        for activity in activities or ():
            if not isinstance(activity, ProfilerActivity):
                raise TypeError(f"activities: {activity!r} is not a torch_npu.profiler.ProfilerActivity")
        self.activities = set(activities) if activities else supported_activities()
        self.record_steps = callable(schedule)
        self.schedule = schedule if callable(schedule) else _default_schedule_fn
        self.on_trace_ready = on_trace_ready
        self.record_shapes = record_shapes
        self.experimental_config = experimental_config
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self.step_rec_fn: Optional[_prof.record_function] = None
        self.stopped = False
        self._inner: Optional[torch.profiler.profile] = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exe_type, exe_val, exc_tb):
        self.stop()

    def _transit(self, prev: Optional[ProfilerAction], current: Optional[ProfilerAction]) -> None:
        recording = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        if prev in recording and (current not in recording or prev is ProfilerAction.RECORD_AND_SAVE):
            self._inner.stop()
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)
            self._inner = None
        if current in recording and (self._inner is None):
            self._inner = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                 record_shapes=self.record_shapes)
            self._inner.start()

    def _enter_step(self) -> None:
        if self.record_steps:
            self.step_rec_fn = _prof.record_function("ProfilerStep#" + str(self.step_num))
            self.step_rec_fn.__enter__()

    def _exit_step(self) -> None:
        if self.record_steps and self.step_rec_fn is not None:
            self.step_rec_fn.__exit__(None, None, None)
            self.step_rec_fn = None

    def start(self):
        self.stopped = False
        self._transit(ProfilerAction.NONE, self.current_action)
        self._enter_step()

    def stop(self):
        self._exit_step()
        self._transit(self.current_action, None)
        self.stopped = True

    def step(self):
        if self.stopped:
            return
        self._exit_step()
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transit(prev, self.current_action)
        self._enter_step()

    def _write_output(self) -> None:
        """What torch-npu's analysis writes, from torch's CPU profile of the same steps."""
        worker = f"{_PATH['worker'] or socket.gethostname()}_{os.getpid()}"
        now = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
        output = os.path.join(_PATH["dir"] or os.getcwd(), f"{worker}_{now}_ascend_pt", "ASCEND_PROFILER_OUTPUT")
        os.makedirs(output, exist_ok=True)
        with tempfile.TemporaryDirectory() as scratch:
            chrome = os.path.join(scratch, "trace.json")
            self._inner.export_chrome_trace(chrome)
            with open(chrome, encoding="utf-8") as fh:
                events = json.load(fh)["traceEvents"]
        with open(os.path.join(output, "trace_view.json"), "w", encoding="utf-8") as fh:
            json.dump(events, fh)
        with open(os.path.join(output, "operator_details.csv"), "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(OPERATOR_HEADERS)
            for event in self._inner.events():
                writer.writerow([event.name, str(event.input_shapes or ""), "", event.self_cpu_time_total,
                                 event.cpu_time_total, 0, 0, 0, 0])
