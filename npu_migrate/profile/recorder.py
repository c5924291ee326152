"""Profiling chosen optimizer steps of an unmodified script, in each rank: torch.profiler, or torch_npu's on the NPU.

Usage::

    from npu_migrate.profile import recorder
    recorder.install_from_env()    # a rank of a job that --profile exported: watches every optimizer step

The steps are the optimizer steps :mod:`npu_migrate.optim_steps` sees (a step is the work from the
end of the previous optimizer step to the end of this one: forward, backward, the step). For
``--profile-steps A-B`` the profiler starts at the end of step A-2 (step A-1 warms it up, as
torch's schedule's ``warmup`` does: its start-up cost stays out of the trace), records steps A to
B, and stops at the end of step B; A = 2 starts recording at the end of step 1, without warm-up;
A = 1 at ``import torch``, so step 1 holds the script's start-up. Each step is a
``ProfilerStep#N`` range named after its optimizer step, as TensorBoard's step view reads them
(torch 2.1's ``profile.step()`` names each range after the step before it).

What is written in ``DIR``, per profiled rank R:

* on CPU and CUDA, ``torch.profiler.profile`` (CPU, and CUDA activities on CUDA) with
  ``torch.profiler.tensorboard_trace_handler(DIR, "rankR")``: ``rankR.<ms>.pt.trace.json``, a
  Chrome trace that TensorBoard's profiler plugin (``tensorboard --logdir DIR``) and
  ui.perfetto.dev open;
* on the NPU, ``torch_npu.profiler.profile`` (CPU and NPU activities) with the experimental
  config of :func:`npu_config` and ``torch_npu.profiler.tensorboard_trace_handler(DIR, "rankR")``:
  ``rankR_<pid>_<time>_ascend_pt/`` with ``ASCEND_PROFILER_OUTPUT/trace_view.json`` (Chrome trace) and
  ``operator_details.csv``, as the Ascend TensorBoard plugin and MindStudio Insight read them;
* ``rankR.profile.json``: the summary :mod:`.summary` reads after the job: the wall time of each
  profiled step (the device synchronized at its start and end; the profiler's own work between
  steps left out), the operators with the most self time (the device's where the profiler
  measured it, else the host's), the trace's path.

A process that ends before step B saves what it recorded (``atexit``); one that never finished an
optimizer step (a DataLoader worker, a tool the script starts) writes nothing.

**The script's own profiler comes first.** torch runs one profiler session in a process: a second
one started beside it cancels the first, whose stop then raises "Can't disable Kineto profiler when
it's not running" (torch 2.1 to 2.6; 2.14 returns an empty profile), in whichever code stops it.
So this profiler never runs beside the script's: where one is recording when this one would start,
this rank is not profiled; where the script starts one (constructs ``torch.autograd.profiler.profile``,
which every ``torch.profiler.profile`` does as it starts) while this one runs, this one stops first
and saves the steps it recorded. Its ``rankR.profile.json`` says so (``yielded``), and the launcher's
summary names the step.
"""

from __future__ import annotations

import atexit
import csv
import functools
import glob
import json
import logging
import os
import sys
import time
from typing import Any

import torch

from npu_migrate import fileio, optim_steps
from npu_migrate.profile.settings import ProfileSettings

logger = logging.getLogger(__name__)

TOP_OPERATORS = 10
"""How many operators each rank's summary keeps, by self time."""

_ACTIVE: list[StepProfiler] = []


def script_profiler_running() -> bool:
    """Whether a profiler records in this process now (the script's own, before this one starts)."""
    enabled = getattr(torch.autograd, "_profiler_enabled", None)
    return bool(enabled()) if enabled is not None else False


def summary_path(directory: str, rank: int) -> str:
    """Where rank ``rank`` writes its summary."""
    return os.path.join(directory, f"rank{rank}.profile.json")


def npu_config(torch_npu_profiler: Any) -> Any:
    """The experimental config of the NPU's profiler: torch-npu's guide's performance set-up.

    Level1 (Level0's operators and tasks, plus CANN's AscendCL calls, AI Core metrics and the
    communication operators a slow rank is found by), the AI Core's pipeline utilisation, no L2
    cache counters (they cost a replay), the simplified output, and text export (the
    ``ASCEND_PROFILER_OUTPUT`` CSV and JSON files).
    """
    p = torch_npu_profiler
    return p._ExperimentalConfig(export_type=p.ExportType.Text, profiler_level=p.ProfilerLevel.Level1,
                                 aic_metrics=p.AiCMetrics.PipeUtilization, l2_cache=False,
                                 data_simplification=True)


class StepProfiler:
    """One rank's profiler, driven by the optimizer steps it sees."""

    def __init__(self, settings: ProfileSettings, rank: int, device: str) -> None:
        self.settings, self.rank, self.device = settings, rank, device
        self.steps_done = 0
        self.prof: Any = None
        self.finished = False
        self.step_times: list[tuple[int, float]] = []  # (step, seconds) of each profiled step that ended
        self._started_at = 0.0  # perf_counter when this step began, after the profiler's own work
        self.watch: optim_steps.StepWatch | None = None
        self._pid = os.getpid()
        self._before: set[str] = set()
        self.keep = True  # whether the trace handler saves (False for a process that never reached step A)
        self.yielded: list[Any] | None = None  # [step, "was recording" | "started"]: the script's own profiler
        self._own = False  # True while this profiler's own calls may construct torch's profiler
        self._unguard: Any = None

    # ------------------------------------------------------------------ the profiler

    def _schedule(self, step: int) -> Any:
        if self.device == "npu":  # torch_npu's profiler has an enum of its own
            from torch_npu.profiler import ProfilerAction
        else:
            from torch.profiler import ProfilerAction
        first, last = self.settings.first, self.settings.last
        if step < first - 1 or step > last or (step == first - 1 and first < 3):
            return ProfilerAction.NONE
        if step == first - 1:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if step == last else ProfilerAction.RECORD

    def _make(self) -> Any:
        worker = f"rank{self.rank}"
        directory = self.settings.directory
        if self.device == "npu":
            import torch_npu.profiler as tp

            save = tp.tensorboard_trace_handler(directory, worker_name=worker)
            return tp.profile(activities=[tp.ProfilerActivity.CPU, tp.ProfilerActivity.NPU],
                              schedule=self._schedule, on_trace_ready=self._saver(save),
                              experimental_config=npu_config(tp))
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        return profile(activities=activities, schedule=self._schedule,
                       on_trace_ready=self._saver(tensorboard_trace_handler(directory, worker_name=worker)))

    def _saver(self, save: Any) -> Any:
        def on_trace_ready(prof: Any) -> None:
            if self.keep:
                save(prof)

        return on_trace_ready

    def _start(self, step: int) -> None:
        """Start the profiler before ``step`` runs, numbered as that optimizer step; not beside the script's."""
        os.makedirs(self.settings.directory, exist_ok=True)
        self._before = set(os.listdir(self.settings.directory))
        if script_profiler_running():
            self.close(yielded=[step, "was recording"])
            return
        self.prof = self._make()
        # Number its steps as the script's optimizer steps: ProfilerStep#N is optimizer step N.
        self.prof.step_num = step
        self.prof.current_action = self._schedule(step)
        self._call(self.prof.start)
        self._guard()

    def _call(self, method: Any) -> None:
        """One of this profiler's own calls, which may construct torch's profiler without yielding."""
        self._own = True
        try:
            method()
        finally:
            self._own = False

    def _guard(self) -> None:
        """Until this profiler stops, a profiler the script starts stops this one first (module docstring)."""
        import torch.autograd.profiler as autograd_profiler

        cls = autograd_profiler.profile
        original = cls.__init__

        def __init__(profile: Any, *args: Any, **kwargs: Any) -> None:
            if not self._own and not self.finished:
                self.close(yielded=[self.steps_done + 1, "started"])
            original(profile, *args, **kwargs)

        functools.update_wrapper(__init__, original)
        cls.__init__ = __init__

        def unguard() -> None:
            if vars(cls).get("__init__") is __init__:
                cls.__init__ = original

        self._unguard = unguard

    def begin(self) -> StepProfiler:
        """Watch the optimizer steps; with ``--profile-steps 1-B``, start now."""
        self.watch = optim_steps.watch(after=self._after_step)
        atexit.register(self.close)
        if self.settings.first == 1:
            self._start(1)
            self._started_at = time.perf_counter()
        return self

    def _synchronize(self) -> None:
        try:
            module = getattr(torch, self.device, None)
            if self.device != "cpu" and module is not None and module.is_available():
                module.synchronize()
        except Exception:  # noqa: BLE001 - a step time without the wait is still a step time
            pass

    def _after_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if self.finished or os.getpid() != self._pid:
            return
        self.steps_done += 1
        if self.steps_done == 1 and self.prof is None and not self._resolve_rank():
            return
        step, first, last = self.steps_done, self.settings.first, self.settings.last
        if first - 1 <= step <= last:
            self._synchronize()
            if step >= first:
                self.step_times.append((step, time.perf_counter() - self._started_at))
        # The profiler's own work between two steps is in neither's time.
        if self.prof is None:
            if step == max(first - 2, 1) and first >= 2:
                self._start(step + 1)
        elif step >= last:
            self.close()
            return
        else:
            self._call(self.prof.step)
        if self.finished:
            return
        if first - 1 <= step < last:
            self._synchronize()
            self._started_at = time.perf_counter()

    def _resolve_rank(self) -> bool:
        """At the first step: the rank from the process group where there is one (a script that starts its
        own ranks with ``mp.spawn`` sets no RANK); False, and nothing more, where it is not profiled."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank()
        if self.settings.profiles(self.rank):
            return True
        self.finished = True
        if self.watch is not None:
            self.watch.undo()
        return False

    # ------------------------------------------------------------------ the end

    def close(self, yielded: list[Any] | None = None) -> None:
        """Stop the profiler, saving what it recorded, and write the summary; once, in this process.

        A process that never finished step A (or, for ``1-B``, any step) saves nothing: the
        profiler's trace handler is skipped. ``yielded``: stopped for the script's own profiler
        (``[step, how]``), which the summary says even where nothing was recorded.
        """
        if self.finished or os.getpid() != self._pid:
            return
        self.finished = True
        self.yielded = yielded
        if self.watch is not None:
            self.watch.undo()
        if self._unguard is not None:
            self._unguard()
        if self.prof is not None:
            self.keep = self.steps_done >= self.settings.first
            self._call(self.prof.stop)
        if not (self.prof is not None and self.keep) and yielded is None:
            return
        try:
            self._write_summary()
        except Exception as exc:  # noqa: BLE001 - the trace is there; the summary says what it can
            print(f"npu_migrate: --profile: rank {self.rank}: the summary could not be written: {exc}",
                  file=sys.stderr, flush=True)

    def _write_summary(self) -> None:
        steps = [s for s, _ in self.step_times]
        times = [t for _, t in self.step_times]
        if not (self.prof is not None and self.keep):
            trace, top, kind = None, [], "cpu"
        elif self.device == "npu":
            trace, top, kind = self._npu_results()
        else:
            trace, top, kind = self._torch_results(max(len(times), 1))
        summary = {
            "job": self.settings.job, "rank": self.rank, "device": self.device, "pid": os.getpid(),
            "profiler": "torch_npu.profiler" if self.device == "npu" else "torch.profiler",
            "steps": steps, "step_times_s": times, "asked": [self.settings.first, self.settings.last],
            "trace": trace, "self_time": kind, "top": top, "yielded": self.yielded,
        }
        fileio.write_atomic(summary_path(self.settings.directory, self.rank), json.dumps(summary, indent=1),
                            mode=fileio.default_mode())

    def _new_entries(self, pattern: str) -> list[str]:
        directory = self.settings.directory
        found = [p for p in glob.glob(os.path.join(glob.escape(directory), pattern))
                 if os.path.basename(p) not in self._before]
        return sorted(found, key=os.path.getmtime)

    def _torch_results(self, steps: int) -> tuple[str | None, list[list[Any]], str]:
        traces = self._new_entries(f"rank{self.rank}.*.pt.trace.json*")
        rows = []
        device_seen = False
        for event in self.prof.key_averages():
            if event.key.startswith("ProfilerStep"):
                continue
            cpu = float(getattr(event, "self_cpu_time_total", 0.0) or 0.0)
            field = "self_device_time_total" if hasattr(event, "self_device_time_total") else "self_cuda_time_total"
            dev = float(getattr(event, field, 0.0) or 0.0)  # torch < 2.4 names it after CUDA
            device_seen = device_seen or dev > 0
            rows.append((event.key, cpu, dev, int(event.count)))
        index = 2 if device_seen else 1
        rows.sort(key=lambda r: r[index], reverse=True)
        top = [[row[0], round(row[index] / steps, 3), row[3]] for row in rows[:TOP_OPERATORS]]
        trace = os.path.relpath(traces[-1], self.settings.directory) if traces else None
        return trace, top, "device" if device_seen else "cpu"

    def _npu_results(self) -> tuple[str | None, list[list[Any]], str]:
        runs = [p for p in self._new_entries(f"rank{self.rank}_*_ascend_pt") if os.path.isdir(p)]
        if not runs:
            return None, [], "cpu"
        output = os.path.join(runs[-1], "ASCEND_PROFILER_OUTPUT")
        trace = os.path.join(output, "trace_view.json")
        totals: dict[str, list[float]] = {}
        device_seen = False
        details = os.path.join(output, "operator_details.csv")
        if os.path.isfile(details):
            with open(details, newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh):
                    name = row.get("Name") or ""
                    if not name or name.startswith("ProfilerStep"):
                        continue
                    host = _number(row.get("Host Self Duration(us)"))
                    dev = _number(row.get("Device Self Duration(us)"))
                    device_seen = device_seen or dev > 0
                    entry = totals.setdefault(name, [0.0, 0.0, 0])
                    entry[0] += host
                    entry[1] += dev
                    entry[2] += 1
        steps = max(len(self.step_times), 1)
        index = 1 if device_seen else 0
        ranked = sorted(totals.items(), key=lambda kv: kv[1][index], reverse=True)[:TOP_OPERATORS]
        top = [[name, round(v[index] / steps, 3), int(v[2])] for name, v in ranked]
        where = os.path.relpath(trace if os.path.isfile(trace) else runs[-1], self.settings.directory)
        return where, top, "device" if device_seen else "cpu"


def _number(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def install_from_env() -> StepProfiler | None:
    """Start profiling as a launcher exported it (``NPU_MIGRATE_PROFILE``...), in a profiled rank."""
    settings = ProfileSettings.from_env()
    if settings is None or _ACTIVE:
        return _ACTIVE[0] if _ACTIVE else None
    rank = int(os.environ.get("RANK", "0") or 0)  # the process group's, at the first step, where there is one
    if settings.first == 1 and not settings.profiles(rank):
        return None
    from npu_migrate import device as nm_device

    try:
        device = nm_device.device_type()
    except Exception:  # noqa: BLE001 - profile what can be profiled
        device = "cuda" if torch.cuda.is_available() else "cpu"
    profiler = StepProfiler(settings, rank, device).begin()
    _ACTIVE.append(profiler)
    return profiler


def active() -> StepProfiler | None:
    """The profiler of this process, if any."""
    return _ACTIVE[0] if _ACTIVE else None
