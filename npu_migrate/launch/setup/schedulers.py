"""Which scheduler started this launcher, and what its environment says about the job.

Usage::

    found = detect(os.environ)
    found.scheduler            # Scheduler.ASCENDJOB
    found.values               # {"nnodes": 2, "node_rank": 1, "nproc": 4, "addr": "10.96.0.12", "port": 2222}
    found.source               # "MindCluster AscendJob (RANK, WORLD_SIZE, LOCAL_RANK, ...)" for the start-up line
    print(describe(found))     # --print-env: every variable read, and what it gave

Detection order (the first that matches wins; flags always win over what is found):

============== ============================================================================
Slurm          ``SLURM_JOB_ID``, ``SLURM_NNODES``, ``SLURM_NODEID``, ``SLURM_JOB_NODELIST``
               (node 0 = the first host of the list).
AscendJob      MindCluster's ascend-operator (``Ascend/mind-cluster``,
               ``component/ascend-operator/pkg/controllers/v1/env.go`` ``setPytorchEnv`` and
               ``setCommonEnv``) gives each pod ``RANK`` = the pod's rank (a node rank, never a
               process rank), ``WORLD_SIZE`` = NPUs per pod x NPU pods, ``LOCAL_WORLD_SIZE`` = NPUs
               per pod, ``LOCAL_RANK`` = the pod's local ranks as a list (``localRankStr``:
               ``0,1,2,3``; docs write ``{0,1,2,3}``), ``MASTER_ADDR`` = the master Service's IP,
               ``MASTER_PORT`` (``DefaultPort`` 2222, ``pkg/api/v1/constants.go``) and
               ``MINDX_TASK_ID``. Recognised by ``MINDX_TASK_ID`` or a list in ``LOCAL_RANK``.
               nnodes = ``WORLD_SIZE / LOCAL_WORLD_SIZE``. ``MASTER_ADDR`` is a Service address,
               so node 0 is not asked to own it.
Volcano        the ``svc`` plugin gives ``VC_<TASK>_HOSTS`` (comma-separated host names, task name
               upper-cased, ``-`` as ``_``) and ``VC_<TASK>_NUM``; the ``env`` plugin
               ``VC_TASK_INDEX``; the ``pytorch`` plugin (``volcano-sh/volcano``,
               ``pkg/controllers/job/plugins/distributed-framework/pytorch``) ``MASTER_ADDR``,
               ``MASTER_PORT`` (23456), ``WORLD_SIZE`` = pods and ``RANK`` = the pod's index
               (master 0, worker i as i + 1), which win when present. Without the plugin the
               hosts of the task named ``master`` come first, then the other tasks' in name
               order; this pod is found by its host name, or by ``VC_TASK_INDEX`` in a one-task job.
Kubeflow       ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``.
Ray worker     ``RAY_JOB_ID`` or ``RAY_RAYLET_PID`` (set by Ray in its worker processes); Ray sets
               ``ASCEND_RT_VISIBLE_DEVICES`` to the NPUs it gave the worker (Ray's
               ``NPUAcceleratorManager``): one process per id, on the npu family (hccl). Ray
               Train's ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` make each worker one
               node of the job.
environment    ``NNODES``, ``NODE_RANK`` (or ``GROUP_RANK``), ``MASTER_ADDR``, ``MASTER_PORT``.
rank table     ``RANK_TABLE_FILE`` (:mod:`.ranktable`): alone, or beside any of the above; the
               table's servers, devices and global ranks are checked against what they say.
============== ============================================================================

Nothing here imports torch: the launcher refuses bad input before its fork server loads it.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from npu_migrate.launch.setup import cluster

RANK_TABLE_ENV = "RANK_TABLE_FILE"
ASCEND_JOB_DEFAULT_PORT = 2222
"""MASTER_PORT an AscendJob gets unless its spec names another (ascend-operator's DefaultPort)."""

VOLCANO_DEFAULT_PORT = 23456
"""MASTER_PORT Volcano's pytorch plugin opens unless given ``--port``."""

_VC_HOSTS = re.compile(r"VC_(.+)_HOSTS")
_RAY_MARKERS = ("RAY_JOB_ID", "RAY_RAYLET_PID")


class Scheduler(Enum):
    """Who started the launcher; the value is the name the start-up line shows."""

    SLURM = "Slurm"
    ASCENDJOB = "MindCluster AscendJob"
    VOLCANO = "Volcano job"
    KUBEFLOW = "Kubeflow/torchrun environment (PET_*)"
    RAY = "Ray worker"
    ENV = "environment"
    RANKTABLE = "HCCL rank table"
    NONE = "defaults"


@dataclass(frozen=True)
class Detected:
    """What the environment says about the job.

    Attributes:
        scheduler: who started the launcher.
        values: any of ``nnodes``, ``node_rank``, ``nproc``, ``addr``, ``port`` it gives.
        read: the variables read, with their values, in the order read (``--print-env``).
        rank_table: ``RANK_TABLE_FILE`` when set.
        addr_is_service: the address is a Service in front of node 0, not one of its own.
        device: the family the scheduler implies (``npu``), used when nothing else chooses one.
    """

    scheduler: Scheduler
    values: dict[str, Any] = field(default_factory=dict)
    read: tuple[tuple[str, str], ...] = ()
    rank_table: str | None = None
    addr_is_service: bool = False
    device: str | None = None

    @property
    def source(self) -> str:
        """The scheduler and the variables it was read from, for the start-up line."""
        if self.scheduler is Scheduler.NONE:
            return "defaults"
        names = ", ".join(name for name, _ in self.read)
        return f"{self.scheduler.value} ({names})" if names else self.scheduler.value


def _int(environ: dict[str, str], name: str) -> int:
    text = environ[name].strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={environ[name]!r} is not an integer") from None


def parse_local_ranks(text: str) -> list[int]:
    """An AscendJob's ``LOCAL_RANK``: ``{0,1,2,3}``, ``0,1,2,3`` or ``0`` -> ``[0, 1, 2, 3]``.

    Raises:
        ValueError: anything else.
    """
    body = text.strip().strip("{}[]").strip()
    parts = [p.strip() for p in body.split(",")] if body else []
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"LOCAL_RANK={text!r} is not a list of local ranks like {{0,1,2,3}}")
    return [int(p) for p in parts]


def _reader(environ: dict[str, str]) -> tuple[list[tuple[str, str]], Any]:
    read: list[tuple[str, str]] = []

    def get(name: str) -> str | None:
        value = environ.get(name)
        if value is not None and value.strip():
            read.append((name, value))
            return value
        return None

    return read, get


def _slurm(environ: dict[str, str]) -> Detected | None:
    if not (environ.get("SLURM_JOB_ID") and environ.get("SLURM_NNODES") and environ.get("SLURM_NODEID")):
        return None
    read, get = _reader(environ)
    values: dict[str, Any] = {"nnodes": _int(environ, "SLURM_NNODES"), "node_rank": _int(environ, "SLURM_NODEID")}
    read += [("SLURM_NNODES", environ["SLURM_NNODES"]), ("SLURM_NODEID", environ["SLURM_NODEID"])]
    nodelist = get("SLURM_JOB_NODELIST") or get("SLURM_NODELIST")
    if nodelist:
        values["addr"] = cluster.expand_hostlist(nodelist)[0]
    return Detected(Scheduler.SLURM, values, tuple(read))


def _ascend_job(environ: dict[str, str]) -> Detected | None:
    local = environ.get("LOCAL_RANK", "")
    listed = "," in local or "{" in local
    if not ((environ.get("MINDX_TASK_ID") or listed) and environ.get("RANK") and environ.get("WORLD_SIZE")):
        return None
    read, get = _reader(environ)
    get("MINDX_TASK_ID")
    node_rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    read += [("RANK", environ["RANK"]), ("WORLD_SIZE", environ["WORLD_SIZE"])]
    per_node = None
    if get("LOCAL_RANK"):
        per_node = len(parse_local_ranks(local))
    if get("LOCAL_WORLD_SIZE"):
        size = _int(environ, "LOCAL_WORLD_SIZE")
        if per_node is not None and size != per_node:
            raise ValueError(f"LOCAL_WORLD_SIZE={size} but LOCAL_RANK={local!r} lists {per_node} local ranks")
        per_node = size
    if per_node is None or per_node < 1:
        raise ValueError("an AscendJob without LOCAL_RANK or LOCAL_WORLD_SIZE (a dynamic-cut job?) does not "
                         "say how many NPUs each pod has")
    if world % per_node:
        raise ValueError(f"WORLD_SIZE={world} is not a multiple of the {per_node} NPUs per pod "
                         "(LOCAL_WORLD_SIZE): expected the job's NPUs, pods x NPUs per pod")
    values: dict[str, Any] = {"nnodes": world // per_node, "node_rank": node_rank, "nproc": per_node}
    if get("MASTER_ADDR"):
        values["addr"] = environ["MASTER_ADDR"].strip()
    if get("MASTER_PORT"):
        values["port"] = _int(environ, "MASTER_PORT")
    get("ASCEND_VISIBLE_DEVICES")
    return Detected(Scheduler.ASCENDJOB, values, tuple(read), addr_is_service=True, device="npu")


def _volcano_tasks(environ: dict[str, str]) -> dict[str, list[str]]:
    tasks: dict[str, list[str]] = {}
    for name, value in environ.items():
        match = _VC_HOSTS.fullmatch(name)
        if match and value.strip():
            tasks[match.group(1)] = [h.strip() for h in value.split(",") if h.strip()]
    return tasks


def _volcano(environ: dict[str, str]) -> Detected | None:
    tasks = _volcano_tasks(environ)
    index_var = "VC_TASK_INDEX" if environ.get("VC_TASK_INDEX") else "VK_TASK_INDEX"
    if not tasks and not environ.get(index_var):
        return None
    read, get = _reader(environ)
    values: dict[str, Any] = {}
    if environ.get("RANK") and environ.get("WORLD_SIZE") and environ.get("MASTER_ADDR"):  # the pytorch plugin
        values = {"nnodes": _int(environ, "WORLD_SIZE"), "node_rank": _int(environ, "RANK"),
                  "addr": environ["MASTER_ADDR"].strip()}
        for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR"):
            get(name)
        if get("MASTER_PORT"):
            values["port"] = _int(environ, "MASTER_PORT")
        get(index_var)
        return Detected(Scheduler.VOLCANO, values, tuple(read))
    order = sorted(tasks, key=lambda t: (t != "MASTER", t))
    hosts = [h for task in order for h in tasks[task]]
    for task in order:
        get(f"VC_{task}_HOSTS")
    if hosts:
        values["nnodes"] = len(hosts)
        values["addr"] = hosts[0]
    me = socket.gethostname().split(".")[0]
    mine = [i for i, h in enumerate(hosts) if h.split(".")[0] == me]
    if len(mine) == 1:
        values["node_rank"] = mine[0]
    elif get(index_var) and len(tasks) <= 1:
        values["node_rank"] = _int(environ, index_var)
    else:
        raise ValueError(f"this pod ({me}) is not among the hosts of VC_*_HOSTS and the job has "
                         f"{len(tasks)} tasks, so {index_var} alone does not give its node rank; enable "
                         "Volcano's pytorch plugin or pass --node-rank")
    return Detected(Scheduler.VOLCANO, values, tuple(read))


def _kubeflow(environ: dict[str, str]) -> Detected | None:
    if not (environ.get("PET_NNODES") or environ.get("PET_NODE_RANK") or environ.get("PET_MASTER_ADDR")):
        return None
    read, get = _reader(environ)
    values: dict[str, Any] = {}
    if get("PET_NNODES"):
        values["nnodes"] = int(environ["PET_NNODES"].split(":")[-1])
    if get("PET_NODE_RANK"):
        values["node_rank"] = _int(environ, "PET_NODE_RANK")
    if get("PET_MASTER_ADDR"):
        values["addr"] = environ["PET_MASTER_ADDR"]
    if get("PET_MASTER_PORT"):
        values["port"] = _int(environ, "PET_MASTER_PORT")
    return Detected(Scheduler.KUBEFLOW, values, tuple(read))


def visible_ids(text: str) -> list[str]:
    """``ASCEND_RT_VISIBLE_DEVICES``-style lists: ``0,1, 3`` -> ``['0', '1', '3']``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _ray(environ: dict[str, str]) -> Detected | None:
    if not any(environ.get(name) for name in _RAY_MARKERS):
        return None
    read, get = _reader(environ)
    for name in _RAY_MARKERS:
        get(name)
    values: dict[str, Any] = {}
    visible = get("ASCEND_RT_VISIBLE_DEVICES")
    if visible:
        values["nproc"] = len(visible_ids(visible))
    if environ.get("RANK") and environ.get("WORLD_SIZE") and environ.get("MASTER_ADDR"):  # Ray Train
        values.update(nnodes=_int(environ, "WORLD_SIZE"), node_rank=_int(environ, "RANK"),
                      addr=environ["MASTER_ADDR"].strip())
        for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR"):
            get(name)
        if get("MASTER_PORT"):
            values["port"] = _int(environ, "MASTER_PORT")
    return Detected(Scheduler.RAY, values, tuple(read), device="npu" if visible else None)


def _plain(environ: dict[str, str]) -> Detected | None:
    node_rank = environ.get("NODE_RANK") or environ.get("GROUP_RANK")
    if not (environ.get("MASTER_ADDR") and environ.get("NNODES") and node_rank):
        return None
    read, get = _reader(environ)
    get("NNODES")
    rank_var = "NODE_RANK" if get("NODE_RANK") else "GROUP_RANK"
    if rank_var == "GROUP_RANK":
        get("GROUP_RANK")
    get("MASTER_ADDR")
    values: dict[str, Any] = {"nnodes": _int(environ, "NNODES"), "node_rank": _int(environ, rank_var),
                              "addr": environ["MASTER_ADDR"]}
    if get("MASTER_PORT"):
        values["port"] = _int(environ, "MASTER_PORT")
    return Detected(Scheduler.ENV, values, tuple(read))


_DETECTORS = (_slurm, _ascend_job, _volcano, _kubeflow, _ray, _plain)


def detect(environ: dict[str, str]) -> Detected:
    """The first scheduler whose variables are set (see the module docstring), and the rank table.

    Raises:
        ValueError: a scheduler's variables that contradict each other or cannot be read.
    """
    table = (environ.get(RANK_TABLE_ENV) or "").strip() or None
    for detector in _DETECTORS:
        found = detector(environ)
        if found is not None:
            if table:
                found = Detected(found.scheduler, found.values, (*found.read, (RANK_TABLE_ENV, table)), table,
                                 found.addr_is_service, found.device)
            return found
    if table:
        return Detected(Scheduler.RANKTABLE, {}, ((RANK_TABLE_ENV, table),), table, device="npu")
    return Detected(Scheduler.NONE)


def job_id_from_env(environ: dict[str, str]) -> str | None:
    """The scheduler's id of this job, the same on every node (Slurm, AscendJob, Ray, torchelastic)."""
    if environ.get("SLURM_JOB_ID"):
        step = environ.get("SLURM_STEP_ID")
        return f"slurm-{environ['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    for name, prefix in (("MINDX_TASK_ID", "ascendjob-"), ("RAY_JOB_ID", "ray-")):
        value = (environ.get(name) or "").strip()
        if value and not any(c.isspace() or c == "/" for c in value):
            return prefix + value
    return environ.get("TORCHELASTIC_RUN_ID") or None


def given_as(key: str, flag: Any, found: Detected) -> str:
    """How a setting was given, for messages: ``--nnodes 3`` or ``the MindCluster AscendJob's 3``."""
    names = {"nnodes": "--nnodes", "node_rank": "--node-rank", "nproc": "--device-num", "addr": "--addr",
             "port": "--port"}
    if flag is not None:
        return f"{names[key]} {flag}"
    return f"{found.scheduler.value}'s {found.values[key]}"


def describe(found: Detected) -> str:
    """``--print-env``: the scheduler, every variable read with its value, and what it gave."""
    lines = [f"scheduler: {found.scheduler.value}"]
    lines += [f"  {name}={value}" for name, value in found.read] or ["  (no scheduler variables set)"]
    if found.values:
        lines.append("gives: " + ", ".join(f"{k}={v}" for k, v in found.values.items()))
    if found.addr_is_service:
        lines.append("the master address is a Service in front of node 0, not one of its own addresses")
    if found.device:
        lines.append(f"device family: {found.device} unless --device or NPU_MIGRATE_DEVICE say otherwise")
    return "\n".join(lines)
