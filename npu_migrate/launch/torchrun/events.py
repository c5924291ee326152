"""``--event-log-handler``: torchelastic's events of the job, recorded through torch's event handlers.

Usage::

    elastic_events.check("console")                      # an unknown handler is refused in one line
    events = Recorder(cfg)                               # nothing is recorded with None or "null"
    events.started(procs)                                # each rank: torchelastic.worker.status.START
    events.ended(procs, code, attempt, seconds)          # each rank's end state, then the job's SUCCEEDED/FAILED

torchrun's agent records these events (``torch.distributed.elastic.agent.server.api``): each
worker's ``START`` when it starts, each worker's end state (``SUCCEEDED``, ``FAILED``, or
``TERMINATED`` for one the agent stopped) when the run ends, and the agent's ``SUCCEEDED`` or
``FAILED``. The launcher records the same names, sources and metadata keys through
``torch.distributed.elastic.events.record(event, destination=NAME)``, so a handler registered
there (``console`` prints each event as JSON on stderr) sees what it would see under torchrun.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from npu_migrate.launch.errors import LaunchUsageError

NULL = "null"
"""torchrun's default handler: events go nowhere."""


def check(name: str) -> None:
    """Refuse a handler torch's registry does not have (torchrun would fail at its first event).

    Raises:
        LaunchUsageError: naming the handler and the known ones.
    """
    from torch.distributed.elastic.events import handlers

    try:
        handlers.get_logging_handler(name)
    except KeyError:
        raise LaunchUsageError(f"--event-log-handler {name!r} is not a registered event handler: expected console "
                               "or null (torch's), or a name registered in torch.distributed.elastic.events."
                               "handlers.") from None


class Recorder:
    """Records one job's torchelastic events on ``cfg.torchrun.event_log_handler`` (nothing for None or ``null``)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.handler = cfg.torchrun.event_log_handler
        self.on = self.handler not in (None, NULL)
        self.host = socket.getfqdn(socket.gethostname()) if self.on else ""

    def _record(self, state: str, source: str, local: int | None = None, restarts: int = 0, run_time: int = 0,
                exit_code: int | None = None, pid: int | None = None, raw_error: str | None = None) -> None:
        from torch.distributed.elastic import events

        cfg = self.cfg
        md: dict[str, Any] = {"group_world_size": cfg.nnodes, "entry_point": "npu_migrate.launch"}
        if local is not None:
            md.update(local_rank=(local,), role_rank=(cfg.rank(local),), role_world_size=(cfg.world_size,),
                      exit_code=(exit_code,), worker_pid=(pid,))
        metadata = {
            "run_id": cfg.job_id, "global_rank": cfg.rank(local) if local is not None else None,
            "group_rank": cfg.node_rank, "worker_id": str(pid) if local is not None and pid else None,
            "role": cfg.torchrun.role, "hostname": self.host, "state": state, "total_run_time": run_time,
            "rdzv_backend": getattr(getattr(cfg, "rdzv", None), "backend", "static"), "raw_error": raw_error,
            "metadata": json.dumps(md), "agent_restarts": restarts,
        }
        events.record(events.Event(f"torchelastic.worker.status.{state}", source=getattr(events.EventSource, source),
                                   metadata=metadata), self.handler)

    def started(self, procs: list[Any], attempt: int) -> None:
        """Each rank of this attempt started (torchrun's ``START`` events)."""
        if self.on:
            for local, proc in enumerate(procs):
                self._record("START", "WORKER", local, attempt, pid=proc.pid)

    def ended(self, procs: list[Any], code: int, attempt: int, run_time: int, stopped: set[int]) -> None:
        """Each rank's end state, then the job's ``SUCCEEDED`` or ``FAILED`` (torchrun's ``run`` result)."""
        if not self.on:
            return
        for local, proc in enumerate(procs):
            exit_code = proc.exitcode
            if exit_code == 0:
                state = "SUCCEEDED"
            elif local in stopped:
                state = "TERMINATED"
            else:
                state = "FAILED"
            self._record(state, "WORKER", local, attempt, run_time, exit_code=None if exit_code == 0 else exit_code,
                         pid=proc.pid)
        self._record("SUCCEEDED" if code == 0 else "FAILED", "AGENT", restarts=attempt, run_time=run_time,
                     raw_error=None if code == 0 else f"the job ended with exit code {code}")
