"""``--preflight``: one short all-reduce on the job's backend, before the script, naming who cannot be reached.

Usage (by the supervisor, after every node joined and before the workers start)::

    problem = run_preflight(cfg, start_method, run_dir, signals)   # None, or one line naming the rank

Every rank of the job runs :func:`preflight_main` in a process of its own (forked like the
workers, with the same environment and device): it reaches the job's ``TCPStore`` on
``MASTER_ADDR:MASTER_PORT``, writes its host and interface there, joins a group on the job's
backend (gloo, nccl or hccl) and all-reduces one element on its device, within
:data:`PREFLIGHT_TIMEOUT_S`. Then the processes exit and free the port for the real workers. On
failure the ranks that never wrote their key are named with their node, else the backend's own
first line with the hosts and interfaces of every rank and a hint (:mod:`..hints`). Ranks are
"missing" only when the failing rank waited for them for the whole timeout: a rank that fails at
once (a wrong interface) names its own error, however late the others are to start.
"""

from __future__ import annotations

import json
import re
import multiprocessing.connection
import os
import socket
import time
from datetime import timedelta
from typing import Any

from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.signals import REAP_AFTER_KILL_S

PREFLIGHT_TIMEOUT_S = float(os.environ.get("NPU_MIGRATE_PREFLIGHT_TIMEOUT_S", "60"))
"""Seconds the pre-flight all-reduce may take (``NPU_MIGRATE_PREFLIGHT_TIMEOUT_S``)."""
WAITED_FRACTION = 0.9
"""A rank that failed after this share of the timeout waited for the others: the ranks that never
wrote their key are named as the cause. One that failed sooner failed by itself (its own error is
the cause, even where slower ranks had not written their key yet)."""


def _result_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"preflight-rank{rank}.json")


def preflight_main(local_rank: int, cfg: LaunchConfig, run_dir: str, timeout: float) -> None:
    """One rank's pre-flight (runs in its own process); writes ``preflight-rank{N}.json``."""
    from npu_migrate.launch.procs.worker import prepare

    prepare(local_rank, cfg, 0)
    rank, world = cfg.rank(local_rank), cfg.world_size
    iface = dict(cfg.net_env).get("GLOO_SOCKET_IFNAME") or os.environ.get("GLOO_SOCKET_IFNAME") or "?"
    me = {"rank": rank, "node": cfg.node_rank, "host": socket.gethostname(), "interface": iface}
    result: dict[str, Any] = {"ok": False, **me}
    store = None
    started = time.monotonic()
    try:
        import torch
        import torch.distributed as dist

        from npu_migrate import device as _device

        store = dist.TCPStore(cfg.addr, cfg.port, world, False, timedelta(seconds=timeout))  # node 0's launcher serves it
        store.set(f"npu_migrate/preflight/{rank}", json.dumps(me))
        dist.init_process_group(cfg.backend, store=dist.PrefixStore("npu_migrate/preflight/pg", store), rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout))
        value = torch.ones(1, device=_device.get_device() if cfg.device != "cpu" else "cpu")
        dist.all_reduce(value)
        if int(value.item()) != world:
            raise RuntimeError(f"the all-reduce gave {value.item():g}, expected {world}")
        dist.barrier()
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported by the launcher in one line
        from npu_migrate.launch.errors import first_line

        # gloo's "[enforce fail at .../device.cc:84] ifa != nullptr. " says nothing to a user
        line = re.sub(r"^\[enforce fail at [^\]]*\] (\S+ [!=]= \S+\. )?", "", first_line(exc, 300))
        result["error"] = f"{type(exc).__name__}: {line}"
        if store is not None and time.monotonic() - started >= timeout * WAITED_FRACTION:
            result["missing"] = _missing(store, world)  # it waited for them: they are the cause
    tmp = _result_path(run_dir, rank) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, _result_path(run_dir, rank))
    os._exit(0)  # no group teardown: the backend may be stuck after a failure


def _missing(store: Any, world: int) -> list[int] | None:
    """Ranks that never wrote their key (None if the store cannot be read)."""
    from npu_migrate.launch.nodes.store import peek as _peek

    try:
        return [r for r in range(world) if _peek(store, f"npu_migrate/preflight/{r}") is None]
    except Exception:  # noqa: BLE001 - the store is gone
        return None


def explain(results: list[dict[str, Any]], cfg: LaunchConfig, timeout: float) -> str | None:
    """One line for the console from this node's ranks' results, or None when every one passed."""
    from npu_migrate.launch.hints import error_hint

    failed = [r for r in results if not r.get("ok")]
    if not failed:
        return None
    for r in failed:
        if r.get("missing"):
            missing = ", ".join(map(str, r["missing"]))
            nodes = sorted({m // cfg.nproc for m in r["missing"]})
            return (f"preflight: rank(s) {missing} (node(s) {', '.join(map(str, nodes))}) never reached the job's "
                    f"store at {cfg.addr}:{cfg.port} within {timeout:g} s: check that those nodes' launchers "
                    f"run and that their interface reaches {cfg.addr} (this node's rank {r['rank']} on "
                    f"{r['host']}, interface {r['interface']}, did).")
    r = failed[0]
    if "error" not in r:
        return f"preflight: rank {r['rank']} on {r['host']} ended without a result (exit code {r.get('exit_code')})."
    hint = error_hint(r["error"])
    return (f"preflight: the {cfg.backend} all-reduce failed on rank {r['rank']} (host {r['host']}, interface "
            f"{r['interface']}): {r['error']}" + (f"; hint: {hint}" if hint else ""))


def run_preflight(cfg: LaunchConfig, start_method: str, run_dir: str, signals: Any,
                  timeout: float = PREFLIGHT_TIMEOUT_S, also: Any = lambda: None) -> str | None:
    """Run the pre-flight on this node's ranks; return None when it passed, else one line.

    Args:
        also: called while waiting; may raise to give up (the job was aborted on another node).

    Raises:
        Interrupted: SIGINT/SIGTERM meanwhile (the pre-flight processes are killed first).
    """
    import signal as _signal

    import torch.multiprocessing as mp

    context = mp.start_processes(preflight_main, args=(cfg, run_dir, timeout), nprocs=cfg.nproc, join=False,
                                 start_method=start_method)
    procs = list(context.processes)
    deadline = time.monotonic() + timeout + 15
    try:
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            signals.check()
            also()
            multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=0.1)
    finally:
        for p in procs:
            if p.exitcode is None and p.pid:
                try:
                    os.kill(p.pid, _signal.SIGKILL)
                except OSError:
                    pass
        reap_deadline = time.monotonic() + REAP_AFTER_KILL_S
        for p in procs:
            p.join(max(0.0, reap_deadline - time.monotonic()))  # bounded: see REAP_AFTER_KILL_S
    results = []
    for i, p in enumerate(procs):
        path = _result_path(run_dir, cfg.rank(i))
        try:
            with open(path, encoding="utf-8") as fh:
                results.append(json.load(fh))
            os.unlink(path)
        except (OSError, ValueError):
            results.append({"ok": False, "rank": cfg.rank(i), "host": socket.gethostname(), "exit_code": p.exitcode})
    return explain(results, cfg, timeout)
