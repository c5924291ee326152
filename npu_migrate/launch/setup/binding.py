"""CPU binding (``--cpu-binding [MODE]``): which CPUs each local rank runs on, and how torch-npu is told.

Usage::

    plan = plan_binding("node", "npu", devices=[0, 1, 2, 3, 4, 5, 6, 7], device_count=8, environ=os.environ)
    plan.cpus[3]          # the CPUs of local rank 3: those of its NPU's NUMA node the launcher may use
    plan.env(3)           # {"CPU_AFFINITY_CONF": "1,npu0:0-23,...,force:1", "OMP_NUM_THREADS": "6"}
    plan.note             # for the start-up line: what was bound and from what

Where each device sits: its PCI device's ``numa_node`` in sysfs. An NPU is ``davinci<N>`` (its
class device's ``device`` link where the driver makes one, else the N-th PCI function of Huawei's
vendor id ``0x19e5`` in bus order); a CUDA GPU its PCI address as CUDA reports it (``bus_ids``),
else the N-th PCI display/3D function of NVIDIA's ``0x10de`` in bus order (``CUDA_VISIBLE_DEVICES``
of numbers mapped). A node's CPUs:
``devices/system/node/node<K>/cpulist``. Every set is intersected with the CPUs the launcher may
use (``os.sched_getaffinity``: a ``taskset``, a container's or Slurm's cgroup CPU set), which is
what binding divides. Where a device's node is not readable, torch-npu's own default applies:
those CPUs ÷ the visible devices, device ``i`` the ``i``-th share. On the CPU family (no device),
every mode gives disjoint shares of those CPUs.

Modes (:data:`MODES`): ``none``; ``node`` (the CPUs of the device's NUMA node, shared by the ranks
whose devices sit there; threads divided among them); ``socket`` (the CPUs of the package holding
that node); ``exclusive`` (a disjoint share of the node's CPUs per rank); torchrun's
``core-complex`` binds as ``exclusive``. Default: ``node`` on the NPU family, as torch-npu
recommends binding there, ``none`` elsewhere.

On the NPU family the plan is also exported as torch-npu reads it: ``CPU_AFFINITY_CONF`` =
``1,npu<i>:<lo>-<hi>,...,force:1`` (mode 1, coarse: every thread of the rank in its range; ``force``
because the launcher owns the binding and torch-npu would otherwise skip a range that conflicts
with a cgroup's CPU set). torch-npu takes one closed range per device: a set with gaps is given as
its longest run. A ``CPU_AFFINITY_CONF`` the user set wins: the launcher binds nothing then.

``NPU_MIGRATE_SYSFS_ROOT`` (tests: a fake ``/sys`` tree) moves where sysfs is read.
Nothing here imports torch.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass

MODES = ("none", "node", "socket", "exclusive", "core-complex")
"""``--cpu-binding``'s values; the last four are torchrun's ``--numa-binding`` values too."""

SYSFS_ROOT_ENV = "NPU_MIGRATE_SYSFS_ROOT"
"""Where sysfs is read (default ``/sys``): tests give a fake tree."""

CONF_ENV = "CPU_AFFINITY_CONF"
"""torch-npu's binding variable."""

_VENDORS = {"npu": "0x19e5", "cuda": "0x10de"}
_CLASSES = {"npu": ("0x1200",), "cuda": ("0x0300", "0x0302")}  # processing accelerator; VGA, 3D controller


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` -> ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(cpus))


def format_cpulist(cpus: list[int] | tuple[int, ...]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``0-3,8``."""
    runs = _runs(sorted(cpus))
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs)


def _runs(cpus: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], cpu)
        else:
            runs.append((cpu, cpu))
    return runs


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, UnicodeError):
        return None


def numa_nodes(sysfs: str) -> dict[int, list[int]]:
    """Every NUMA node and its CPUs (empty where sysfs has no nodes)."""
    nodes: dict[int, list[int]] = {}
    for path in glob.glob(os.path.join(sysfs, "devices", "system", "node", "node[0-9]*", "cpulist")):
        text = _read(path)
        if text is not None:
            try:
                nodes[int(os.path.basename(os.path.dirname(path))[4:])] = parse_cpulist(text)
            except ValueError:
                continue
    return nodes


def _package_of(sysfs: str, cpu: int) -> str | None:
    return _read(os.path.join(sysfs, "devices", "system", "cpu", f"cpu{cpu}", "topology", "physical_package_id"))


def _pci_functions(sysfs: str, family: str) -> list[str]:
    """The family's PCI functions (their sysfs directories) in bus order."""
    vendor, classes = _VENDORS.get(family), _CLASSES.get(family, ())
    found = []
    for path in sorted(glob.glob(os.path.join(sysfs, "bus", "pci", "devices", "*"))):
        if (_read(os.path.join(path, "vendor")) or "").lower() == vendor and \
                (_read(os.path.join(path, "class")) or "").lower().startswith(classes):
            found.append(path)
    return found


def device_numa_node(sysfs: str, family: str, physical: int, bus_id: str | None = None) -> int | None:
    """The NUMA node of device ``physical`` (a ``davinci`` number, a CUDA ordinal), or None where unknown.

    ``bus_id``: the device's PCI address (``0000:3b:00.0``) where its runtime says it: read first.
    """
    paths: list[str] = [os.path.join(sysfs, "bus", "pci", "devices", bus_id.lower(), "numa_node")] if bus_id else []
    if family == "npu":  # the class device's link to its PCI function, where the driver makes one
        paths += glob.glob(os.path.join(sysfs, "class", "*", f"davinci{physical}", "device", "numa_node"))
    functions = _pci_functions(sysfs, family)
    if physical < len(functions):
        paths.append(os.path.join(functions[physical], "numa_node"))
    for path in paths:
        text = _read(path)
        if text is not None and text.lstrip("-").isdigit() and int(text) >= 0:
            return int(text)
    return None


def physical_ids(family: str, devices: list[int], environ: Mapping[str, str]) -> list[int]:
    """Each local rank's device as the host numbers it: the visible-devices mask maps logical to physical."""
    name = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}.get(family)
    mask = (environ.get(name) or "") if name else ""
    items = [item.strip() for item in mask.split(",") if item.strip()]
    if not items or not all(item.isdigit() for item in items):
        return list(devices)
    return [int(items[d]) if d < len(items) else d for d in devices]


def _share(cpus: list[int], index: int, parts: int) -> list[int]:
    """The ``index``-th of ``parts`` disjoint, contiguous shares of ``cpus`` (fewer CPUs than parts: one each, reused)."""
    if not cpus:
        return []
    if len(cpus) < parts:
        return [cpus[index % len(cpus)]]
    per, extra = divmod(len(cpus), parts)
    start = index * per + min(index, extra)
    return cpus[start:start + per + (index < extra)]


@dataclass(frozen=True)
class Binding:
    """The CPUs of each local rank, and what the workers are told.

    Attributes:
        mode: the mode that applies (``none``: nothing bound).
        cpus: each local rank's CPUs (empty where nothing is bound).
        threads: each local rank's thread count (its CPUs, divided among the ranks sharing them).
        conf: ``CPU_AFFINITY_CONF`` for the workers (NPU family; None elsewhere or where the user set it).
        note: what was bound, from what, for the start-up line and ``--print-env``.
    """

    mode: str = "none"
    cpus: tuple[tuple[int, ...], ...] = ()
    threads: tuple[int, ...] = ()
    conf: str | None = None
    note: str = ""

    @property
    def active(self) -> bool:
        return bool(self.cpus)

    def env(self, local_rank: int) -> dict[str, str]:
        """The rank's variables: ``CPU_AFFINITY_CONF`` on the NPU family, ``OMP_NUM_THREADS`` from its set."""
        env: dict[str, str] = {}
        if self.conf:
            env[CONF_ENV] = self.conf
        if local_rank < len(self.threads):
            env["OMP_NUM_THREADS"] = str(self.threads[local_rank])
        return env


def default_mode(family: str) -> str:
    """``node`` on the NPU family (torch-npu recommends binding there), ``none`` elsewhere."""
    return "node" if family == "npu" else "none"


def plan_binding(mode: str | None, family: str, devices: list[int], device_count: int,
                 environ: Mapping[str, str], allowed: list[int] | None = None,
                 sysfs_root: str | None = None, bus_ids: list[str | None] | None = None) -> Binding:
    """Each local rank's CPUs for ``mode`` (None: :func:`default_mode`).

    Args:
        mode: one of :data:`MODES`, or None for the family's default.
        family: ``npu``, ``cuda`` or ``cpu``.
        devices: each local rank's device index as torch numbers it (CPU: the local ranks).
        device_count: the devices visible (torch-npu's default split divides by it).
        environ: for the visible-devices mask, ``CPU_AFFINITY_CONF`` and :data:`SYSFS_ROOT_ENV`.
        allowed: the CPUs the launcher may use (default: its affinity).
        sysfs_root: where sysfs is (default: :data:`SYSFS_ROOT_ENV`, else ``/sys``).
        bus_ids: each local rank's device's PCI address where the runtime reports it (CUDA's
            ``get_device_properties``); else the device is found by vendor and bus order.
    """
    mode = default_mode(family) if mode is None else mode
    if mode == "none" or not devices:
        return Binding()
    if family == "npu" and environ.get(CONF_ENV):
        return Binding(note=f"CPU binding by torch-npu as {CONF_ENV}={environ[CONF_ENV]} says (the user's; the "
                            "launcher binds nothing)")
    if allowed is None:
        try:
            allowed = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            allowed = list(range(os.cpu_count() or 1))
    allowed = sorted(allowed)
    total = os.cpu_count() or len(allowed)
    restricted = f" (the launcher may use {len(allowed)} of the host's {total}: {format_cpulist(allowed)})" \
        if len(allowed) < total else ""
    if family not in _VENDORS:
        cpus = [_share(allowed, i, len(devices)) for i in range(len(devices))]
        how = "disjoint shares of the allowed CPUs" if len(allowed) >= len(devices) else (
            f"{len(devices)} ranks on {len(allowed)} allowed CPU(s): one CPU each, shared in turn")
    else:
        cpus, how = _device_sets(mode, family, devices, device_count, environ, allowed,
                                 sysfs_root or environ.get(SYSFS_ROOT_ENV) or "/sys", bus_ids or [])
    sharing = [sum(1 for other in cpus if other == mine) for mine in cpus]
    threads = tuple(max(1, len(mine) // n) for mine, n in zip(cpus, sharing))
    conf = None
    if family == "npu":
        parts = []
        for device, mine in zip(devices, cpus):
            lo, hi = max(_runs(mine), key=lambda run: run[1] - run[0])
            parts.append(f"npu{device}:{lo}-{hi}")
        conf = ",".join(["1", *parts, "force:1"])
    shown = "; ".join(f"rank {i}: {format_cpulist(mine)}" for i, mine in enumerate(cpus))
    note = f"CPU binding {mode} ({how}{restricted}): {shown}"
    return Binding(mode=mode, cpus=tuple(tuple(c) for c in cpus), threads=threads, conf=conf, note=note)


def _device_sets(mode: str, family: str, devices: list[int], device_count: int,
                 environ: Mapping[str, str], allowed: list[int],
                 sysfs: str, bus_ids: list[str | None]) -> tuple[list[list[int]], str]:
    """Each rank's CPUs from its device's NUMA node, else torch-npu's default split."""
    nodes = numa_nodes(sysfs)
    allowed_set = set(allowed)
    found = [device_numa_node(sysfs, family, p, bus_ids[i] if i < len(bus_ids) else None)
             for i, p in enumerate(physical_ids(family, devices, environ))]
    split = max(device_count, len(devices), 1)
    cpus: list[list[int]] = []
    fallback = 0
    for device, node in zip(devices, found):
        near = [c for c in nodes.get(node, []) if c in allowed_set] if node is not None else []
        if mode == "socket" and near:  # every node of the package that holds the device's node
            package = _package_of(sysfs, nodes[node][0])
            if package is not None:
                near = sorted(c for members in nodes.values() if members and _package_of(sysfs, members[0]) == package
                              for c in members if c in allowed_set)
        if not near:  # unknown node, or none of its CPUs allowed: torch-npu's own default
            fallback += 1
            cpus.append(_share(allowed, device, split))
            continue
        cpus.append(near)
    if mode in ("exclusive", "core-complex"):
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, mine in enumerate(cpus):
            groups.setdefault(tuple(mine), []).append(i)
        for group, members in groups.items():
            for k, i in enumerate(members):
                cpus[i] = _share(list(group), k, len(members))
    scope = {"node": "NUMA node", "socket": "socket", "exclusive": "share of the NUMA node",
             "core-complex": "share of the NUMA node"}[mode]
    if fallback == len(devices):
        how = f"each device's NUMA node unknown: the allowed CPUs ÷ {split} devices, as torch-npu's default"
    elif fallback:
        how = f"each device's {scope}; {fallback} device(s) with no known node: torch-npu's default split"
    else:
        how = f"each device's {scope}"
    return cpus, how


def describe_host(environ: Mapping[str, str], allowed: list[int] | None = None,
                  sysfs_root: str | None = None) -> str:
    """For ``--print-env``: the CPUs the launcher may use, the NUMA nodes, and each device's node as sysfs says."""
    sysfs = sysfs_root or environ.get(SYSFS_ROOT_ENV) or "/sys"
    if allowed is None:
        try:
            allowed = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            allowed = list(range(os.cpu_count() or 1))
    parts = [f"CPU binding: the launcher may use CPUs {format_cpulist(allowed)} ({len(allowed)} of "
             f"{os.cpu_count() or len(allowed)})"]
    nodes = numa_nodes(sysfs)
    if nodes:
        parts.append("NUMA nodes " + ", ".join(f"{k}: {format_cpulist(v)}" for k, v in sorted(nodes.items())))
    for family, name in (("npu", "davinci"), ("cuda", "GPU ")):
        found = [device_numa_node(sysfs, family, i) for i in range(len(_pci_functions(sysfs, family)))]
        if found:
            parts.append(", ".join(f"{name}{i} on node {'?' if n is None else n}" for i, n in enumerate(found)))
    if environ.get(CONF_ENV):
        parts.append(f"{CONF_ENV}={environ[CONF_ENV]} is yours: torch-npu binds as it says, the launcher does not")
    return "; ".join(parts)
