"""torchrun's flags as one node's job runs them: the process count's words, the family they name, and
the settings the launcher's parts read (``LaunchConfig.torchrun``).

Usage (by :func:`.config.make_config`)::

    device = nproc_family("gpu", opts.device)                   # "cuda"; --device npu with it: refused
    spec = device_spec("gpu", device, _device.device_spec)      # no CUDA: a usage error, as torchrun's
    cfg_fields = settle(opts, spec, environ, nproc)             # {"torchrun": Settings(...)}, checked

The flags themselves are :mod:`.flags`'; :class:`Settings` is read by the worker's
environment (:meth:`.config.LaunchConfig.worker_env`), the relay's prefix (``--role``), the
supervisor and :mod:`..procs.ranks` (``--signals-to-handle``, ``--shutdown-timeout``,
``--monitor-interval``), :mod:`.events` and the rendezvous (``--local-addr``).
"""

from __future__ import annotations

import signal
import socket
from dataclasses import dataclass
from typing import Any, Callable

from npu_migrate.errors import DeviceUnavailableError
from npu_migrate.launch.errors import LaunchUsageError
from npu_migrate.launch.torchrun.flags import DEFAULT_SIGNALS

DEFAULT_STOP_SIGNALS: tuple[int, ...] = tuple(int(getattr(signal, name)) for name in DEFAULT_SIGNALS)
"""The signals that stop the job when ``--signals-to-handle`` is left out (torchrun's default)."""

NPROC_FAMILIES = {"cpu": "cpu", "gpu": "cuda", "npu": "npu"}
"""The family a ``--nproc-per-node`` word counts, where ``--device`` does not name one."""


@dataclass(frozen=True)
class Settings:
    """torchrun's flags as one node's job runs them (``LaunchConfig.torchrun``; :func:`settle` makes it).

    Attributes:
        role: ``--role``: ROLE_NAME and the prefix's ``${role_name}``.
        monitor_interval: ``--monitor-interval``: how often the launcher looks at signals, hangs and
            the board while ranks run (None: :data:`.timing.WORKER_POLL_S`).
        stop_signals: ``--signals-to-handle``: the signals that stop the job, forwarded to the ranks.
        shutdown_timeout: ``--shutdown-timeout``: seconds before SIGKILL (None: the launcher's defaults).
        virtual_local_rank: ``--virtual-local-rank``: LOCAL_RANK=0, each rank sees its own device only.
        visible: the visible-devices list the launcher was started with (``--virtual-local-rank`` maps
            local rank L to its L-th entry; empty: L itself), and ``visible_env``, that variable: the
            family's (``ASCEND_RT_VISIBLE_DEVICES``...), CUDA's on CPU (torchrun sets it whatever the device).
        local_addr: ``--local-addr``: this node's address in the rendezvous (None: the interface's).
        event_log_handler: ``--event-log-handler``: torch's event handler for torchelastic events.
        numa_binding: ``--numa-binding``: accepted, not applied yet.
    """

    role: str = "default"
    monitor_interval: float | None = None
    stop_signals: tuple[int, ...] = DEFAULT_STOP_SIGNALS
    shutdown_timeout: float | None = None
    virtual_local_rank: bool = False
    visible: tuple[str, ...] = ()
    visible_env: str = "CUDA_VISIBLE_DEVICES"
    local_addr: str | None = None
    event_log_handler: str | None = None
    numa_binding: str | None = None

    def env(self, local_rank: int) -> dict[str, str]:
        """What ``--virtual-local-rank`` changes in a worker's variables (torchrun's ``_set_local_rank_env``)."""
        if not self.virtual_local_rank:
            return {}
        return {"LOCAL_RANK": "0", self.visible_env: self.visible[local_rank] if self.visible else str(local_rank)}

    def signals_env(self) -> str:
        """``TORCHELASTIC_SIGNALS_TO_HANDLE`` as torchrun's agent exports it to the ranks: the signals'
        names, comma-separated (``SIGTERM,SIGINT,SIGHUP,SIGQUIT`` by default)."""
        return ",".join(signal.Signals(number).name for number in self.stop_signals)

    def device_index(self, local_rank: int) -> int:
        """The device index a local rank binds: its local rank, or 0 with ``--virtual-local-rank``."""
        return 0 if self.virtual_local_rank else local_rank


def async_error_handling_env() -> str:
    """The variable torchrun's agent sets for NCCL's async error handling, in this torch's spelling
    (``NCCL_ASYNC_ERROR_HANDLING`` before torch 2.2), read without importing torch."""
    import importlib.metadata

    try:
        version = tuple(int(p) for p in importlib.metadata.version("torch").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        version = (0, 0)
    return "NCCL_ASYNC_ERROR_HANDLING" if version < (2, 2) else "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def nproc_family(keyword: str | None, device: str | None) -> str | None:
    """The device family for ``--nproc-per-node WORD`` and ``--device``; conflicts refused in one line.

    Raises:
        LaunchUsageError: ``xpu`` (no launcher family), or a word that names another family than ``--device``.
    """
    if keyword == "xpu":
        raise LaunchUsageError("--nproc-per-node xpu: the launcher runs the npu, cuda and cpu device families, not "
                               "xpu; pass a number, auto, cpu, gpu or npu.")
    family = NPROC_FAMILIES.get(keyword or "")
    if family is None:
        return device
    if device not in (None, "auto", family):
        raise LaunchUsageError(f"--nproc-per-node {keyword} counts {family} devices, but --device is {device}: "
                               f"give one of them, or --nproc-per-node auto (the devices of --device {device}).")
    return family


def device_spec(keyword: str | None, device: str | None, find: Callable[[str | None], Any]) -> Any:
    """``find(device)``; where ``--nproc-per-node gpu``/``npu`` named a family with no device, a usage error.

    torchrun refuses ``gpu`` without CUDA ("Cuda is not available."): bad input, not a failure.
    """
    try:
        return find(device)
    except DeviceUnavailableError as exc:
        if keyword not in NPROC_FAMILIES:
            raise
        raise LaunchUsageError(f"--nproc-per-node {keyword}: {exc}") from exc


def settle(opts: Any, spec: Any, environ: dict[str, str], nproc: int) -> dict[str, Settings]:
    """``LaunchConfig``'s ``torchrun`` field from the options, once the family (``spec``) and count are known.

    Raises:
        LaunchUsageError: an unknown event handler, a --local-addr that does not resolve,
            --virtual-local-rank beyond the visible devices.
    """
    if opts.local_addr is not None:
        try:
            socket.getaddrinfo(opts.local_addr, None)
        except (socket.gaierror, UnicodeError) as exc:
            raise LaunchUsageError(f"--local-addr {opts.local_addr!r} does not resolve "
                                   f"({exc.args[-1] if exc.args else exc}): pass an address of this host.") from exc
    if opts.event_log_handler is not None:
        from npu_migrate.launch.torchrun import events as elastic_events

        elastic_events.check(opts.event_log_handler)
    visible_env = spec.visible_devices_env or "CUDA_VISIBLE_DEVICES"
    visible = tuple(v.strip() for v in environ.get(visible_env, "").split(",") if v.strip())
    if opts.virtual_local_rank and visible and nproc > len(visible):
        raise LaunchUsageError(f"--virtual-local-rank: local rank {len(visible)} exceeds the devices in "
                               f"{visible_env}={environ[visible_env]}: run {len(visible)} or fewer processes per node.")
    given = {name: getattr(opts, name) for name in ("role", "monitor_interval", "shutdown_timeout", "virtual_local_rank",
                                                     "local_addr", "event_log_handler", "numa_binding")}
    if opts.signals_to_handle is not None:
        given["stop_signals"] = tuple(opts.signals_to_handle)
    return {"torchrun": Settings(visible=visible, visible_env=visible_env, **given)}
