"""One node's share of a job: the checked settings and the world table (what each worker runs: :mod:`.target`).

Usage::

    cfg = make_config(LaunchOptions(nproc=2, nnodes=2, node_rank=1, addr="10.0.0.1", port=29500))
    cfg = make_config(nproc=2, nnodes=2, node_rank=1, addr="10.0.0.1", port=29500)   # the same
    cfg.worker_env(local_rank=1)     # RANK=3 LOCAL_RANK=1 WORLD_SIZE=4 ... OMP_NUM_THREADS ...
    print(world_table(cfg, Target(script="train.py")))   # --dry-run

The options the user gave (:class:`.options.LaunchOptions`: flags, or ``spawn()``'s keyword
arguments) come first, then the scheduler's environment (:mod:`.schedulers`: Slurm,
AscendJob, Volcano, Kubeflow, Ray, plain variables) and an HCCL rank table (:mod:`.ranktable`),
then single-node defaults. Input that cannot work is refused here, in one line, before anything
starts: ports inside HCCL's range (:mod:`.hccl`), more CPU processes than
:data:`CPU_PROCESSES_PER_CORE` allows, a rank table that disagrees with the job.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass, replace
from typing import Any, Callable

from npu_migrate.launch.setup import binding as cpu_binding, cluster, hccl, ports, ranktable, schedulers

from npu_migrate.launch.torchrun import rdzv as rdzv_flags, settings as torchrun_settings
from npu_migrate.launch.errors import LaunchError, LaunchUsageError
from npu_migrate.launch.setup.options import DEFAULT_JOIN_TIMEOUT, DEFAULT_NODE_TIMEOUT, LaunchOptions, effective_timeout
from npu_migrate.launch.setup.output_settings import OutputSettings
from npu_migrate.launch.setup.ports import CONTROL_PORT_OFFSET, DEFAULT_PORT, _port_is_free, pick_free_port
from npu_migrate.launch.setup.target import Target

CPU_PROCESSES_PER_CORE = 16
"""Most CPU ranks per core: CPU ranks are for tests and debugging, each is a Python process with
torch loaded (hundreds of MB) and gloo connects every pair of them, so far beyond a few per core the
node swaps and thrashes instead of running the job (``--device-num 1000000`` would fork until the
host falls over)."""

@dataclass(frozen=True)
class LaunchConfig:
    """Everything about one node's share of the job.

    Attributes:
        nproc: processes (devices) on this node.
        nnodes: nodes in the job (with ``rdzv.min_nodes``, the most until the rendezvous fixes it).
        node_rank: index of this node (-1 until the rendezvous assigns it, with ``rdzv.assign``).
        addr: address of node 0, where rank 0 serves the rendezvous.
        port: MASTER_PORT.
        device: device family of the workers.
        backend: torch.distributed backend of that family.
        log_dir: one ``rank{N}.log`` per rank here instead of the console.
        output: prefix, console filter, --tee and --log-append (:mod:`..procs.output`).
        max_restarts: how often the whole job is started again after a failure.
        join_timeout: seconds to wait for the other nodes' launchers.
        sources: where nnodes, node rank and address came from (flags, Slurm...).
        omp_threads: threads per rank (OMP_NUM_THREADS and torch.set_num_threads); None where
            the user set OMP_NUM_THREADS.
        job_id: the token every node of this job shares; launchers of other jobs are refused.
        node_timeout: seconds without a heartbeat before a node counts as lost.
        net_env: interface variables for the workers (GLOO_SOCKET_IFNAME...).
        net_note: how the interface was chosen, for the start-up line.
        hang_timeout: seconds without progress before the job counts as hung (0: off; see
            :mod:`..hangs.watchdog` for the default).
        hang_action: ``"end"`` the job on a hang (exit 1), or only ``"report"`` it.
        error_file: where to write the JSON report of every rank's exit (``--error-file``).
        preflight: run a short all-reduce on the backend before the script (:mod:`..procs.preflight`).
        ranks: the global rank of each local rank, from an HCCL rank table (empty: node rank x
            processes per node + local rank).
        scheduler: who started the launcher (:class:`.schedulers.Scheduler` value), for messages.
        agreed: the HCCL variables every node must share, as this node has them (:mod:`.hccl`).
        rank_table: the rank table the ranks come from.
        rdzv: torchrun's rendezvous flags as this job runs them (:mod:`..torchrun.rdzv`).
        torchrun: torchrun's other flags as this job runs them (:class:`.torchrun_settings.Settings`).
        error_files: each local rank's ``TORCHELASTIC_ERROR_FILE`` in the attempt that runs (:mod:`..procs.ranks`).
    """

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    addr: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    device: str = "cpu"
    backend: str = "gloo"
    log_dir: str | None = None
    max_restarts: int = 0
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    sources: str = "defaults"
    omp_threads: int | None = None
    job_id: str = "npu_migrate"
    node_timeout: float = DEFAULT_NODE_TIMEOUT
    net_env: tuple[tuple[str, str], ...] = ()
    net_note: str = ""
    hang_timeout: float = 0.0
    hang_action: str = "end"
    error_file: str | None = None
    preflight: bool = False
    output: OutputSettings = OutputSettings()
    ranks: tuple[int, ...] = ()
    scheduler: str = "defaults"
    agreed: tuple[tuple[str, str], ...] = ()
    rank_table: str | None = None
    rdzv: rdzv_flags.RdzvSettings = rdzv_flags.RdzvSettings()
    torchrun: torchrun_settings.Settings = torchrun_settings.Settings()
    error_files: tuple[str, ...] = ()
    binding: cpu_binding.Binding = cpu_binding.Binding()

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def rank(self, local_rank: int) -> int:
        """Global rank of a local process: the rank table's, else node rank x processes per node + local index."""
        if self.ranks:
            return self.ranks[local_rank]
        return self.node_rank * self.nproc + local_rank

    def device_of(self, local_rank: int) -> str:
        return "cpu" if self.device == "cpu" else f"{self.device}:{self.torchrun.device_index(local_rank)}"

    def worker_env(self, local_rank: int, restart_count: int = 0) -> dict[str, str]:
        """The variables a worker gets: torchrun's, plus NODE_RANK and NPU_MIGRATE_DEVICE."""
        env = {
            "RANK": str(self.rank(local_rank)),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_RANK": str(self.rank(local_rank)),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": self.torchrun.role,
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.addr,
            "MASTER_PORT": str(self.port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            "TORCHELASTIC_RUN_ID": self.job_id,
            "TORCHELASTIC_SIGNALS_TO_HANDLE": self.torchrun.signals_env(),  # torchrun's agent sets it (torch 2.8+)
            "NPU_MIGRATE_DEVICE": self.device,
        }
        async_name = torchrun_settings.async_error_handling_env()  # NCCL_ASYNC_ERROR_HANDLING before torch 2.2
        env[async_name] = os.environ.get(async_name, "1")
        if local_rank < len(self.error_files):  # the attempt's, as torchrun's LogsSpecs gives it
            env["TORCHELASTIC_ERROR_FILE"] = self.error_files[local_rank]
        env.update(self.torchrun.env(local_rank))  # --virtual-local-rank
        if self.omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        bound = self.binding.env(local_rank)  # CPU_AFFINITY_CONF; threads from the rank's own CPUs
        if self.omp_threads is None:  # the user's OMP_NUM_THREADS wins
            bound.pop("OMP_NUM_THREADS", None)
        env.update(bound)
        env.update(self.net_env)
        hccl_wait = hccl.connect_timeout(self.backend, self.nnodes, dict(os.environ))
        if hccl_wait is not None:  # a large job's communicator needs longer to form (unless the user said)
            env[hccl.CONNECT_TIMEOUT_ENV] = str(hccl_wait)
        return env


def _slurm_first_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``gpu[07-09,12],cpu1`` -> ``gpu07``."""
    return cluster.expand_hostlist(nodelist, use_scontrol=False)[0]


def _plain_settings(
    nproc: int | None,
    nnodes: int | None,
    node_rank: int | None,
    addr: str | None,
    port: int | None,
    max_restarts: int,
    environ: dict[str, str],
    rank_table_timeout: float | None = None,
    assign: bool = False,
    standalone: bool = False,
) -> dict[str, Any]:
    """The checks that need no torch, so bad input is refused before anything heavy starts (``assign``:
    node ranks from the rendezvous; no scheduler's node rank, and no node-0 checks before it)."""
    given = {"nnodes": nnodes, "node_rank": node_rank, "addr": addr, "port": port, "nproc": nproc}
    try:
        avoid = hccl.host_ports(environ)
    except ValueError as exc:
        raise LaunchUsageError(f"{exc} Fix or unset it.") from exc
    try:
        found = schedulers.detect({} if standalone else environ)  # --standalone: this host alone
    except ValueError as exc:
        if nnodes is None or node_rank is None:
            raise LaunchUsageError(f"could not read the cluster environment: {exc}. Pass --nnodes, --node-rank "
                                   "and --addr.") from exc
        found = schedulers.Detected(schedulers.Scheduler.NONE, rank_table=environ.get(schedulers.RANK_TABLE_ENV) or None)
    assign = assign and not found.rank_table  # a rank table numbers the servers itself
    from_env = [k for k in found.values if given.get(k) is None and not (assign and k == "node_rank")]
    values = {k: (v if v is not None else found.values.get(k)) for k, v in given.items()}
    if assign:
        values["node_rank"] = None
    sources = ", ".join(
        part for part in (
            "flags" if any(given[k] is not None for k in ("nnodes", "node_rank", "addr", "port")) else "",
            f"{found.source}: {', '.join(k.replace('nproc', 'device_num') for k in from_env)}" if from_env else "",
        ) if part
    ) or "defaults"
    ranks: tuple[int, ...] = ()
    addr_is_service = found.addr_is_service and given["addr"] is None
    if found.rank_table:
        table, server = ranktable.settle(found, values, given, rank_table_timeout, environ)
        values.update(nnodes=len(table.servers), node_rank=server.index, nproc=len(server.devices))
        ranks = server.ranks
        if given["addr"] is None and table.servers[0].address():
            # Node 0 holds global rank 0, whose store the workers meet at: the table's first server.
            values["addr"], addr_is_service = table.servers[0].address(), False
        sources += f"; ranks from rank table {table.path} (version {table.version}, {len(table.servers)} server(s))"
    nnodes = 1 if values["nnodes"] is None else int(values["nnodes"])
    assign = assign and nnodes > 1
    node_rank = -1 if assign else 0 if values["node_rank"] is None else int(values["node_rank"])
    addr = "127.0.0.1" if values["addr"] is None else str(values["addr"])
    nproc = None if values["nproc"] is None else int(values["nproc"])

    if nnodes < 1:
        raise LaunchUsageError(f"--nnodes {nnodes} is not positive: expected the number of nodes, 1 or more.")
    if not assign and not 0 <= node_rank < nnodes:
        raise LaunchUsageError(
            f"--node-rank {node_rank} is outside [0, {nnodes}) for --nnodes {nnodes}: "
            "give each node a different rank from 0 to nnodes-1."
        )
    if nproc is not None and nproc < 1:
        raise LaunchUsageError(f"--device-num {nproc} is not positive: expected 1 or more processes per node.")
    if max_restarts < 0:
        raise LaunchUsageError(f"--max-restarts {max_restarts} is negative: expected 0 or more.")
    try:
        socket.getaddrinfo(addr, None)
    except (socket.gaierror, UnicodeError) as exc:
        raise LaunchUsageError(
            f"--addr {addr!r} does not resolve ({exc.args[-1] if exc.args else exc}). Pass node 0's IP "
            "address or a host name every node can resolve."
        ) from exc
    if nnodes > 1 and node_rank == 0 and not addr_is_service and not cluster.is_local_address(addr):
        raise LaunchUsageError(
            f"--addr {addr} is not an address of this host, but this is node 0, which serves the job "
            f"there: run node rank 0 on the host that has {addr}, or pass one of this host's addresses."
        )
    if values["port"] is None:
        port = pick_free_port(avoid) if nnodes == 1 else DEFAULT_PORT
        port_from = "picked" if nnodes == 1 else f"--port {DEFAULT_PORT} (the default for several nodes)"
    else:
        port = int(values["port"])
        port_from = schedulers.given_as("port", given["port"], found)
        last = 65535 - (CONTROL_PORT_OFFSET if nnodes > 1 else 0)
        if not 1 <= port <= last:
            raise LaunchUsageError(f"--port {port} is outside 1-{last}: pick a free TCP port.")
        if node_rank == 0:
            wanted = [port] if nnodes == 1 else [port, port + CONTROL_PORT_OFFSET]
            busy = [p for p in wanted if not _port_is_free(p)]
            if busy:
                raise LaunchError(
                    f"port {busy[0]} is in use on this host: pick another --port"
                    + (" or leave it out to get a free one." if nnodes == 1 else
                       f" (the same on every node; the launcher also uses --port + {CONTROL_PORT_OFFSET}).")
                )
    return {"nnodes": nnodes, "node_rank": node_rank, "addr": addr, "port": port, "sources": sources,
            "nproc": nproc, "ranks": ranks, "found": found, "hccl_ports": avoid, "port_from": port_from,
            "assign": assign}


def default_job_id(addr: str, port: int, identity: str, environ: dict[str, str]) -> str:
    """The scheduler's job id where there is one, else a hash of what every node was given alike."""
    from_env = schedulers.job_id_from_env(environ)
    if from_env:
        return from_env
    digest = hashlib.sha256(f"{addr}\0{port}\0{identity}".encode()).hexdigest()[:16]
    return f"npu_migrate-{digest}"


def _accelerators(spec: Any) -> int:
    """How many devices of ``spec``'s own family are visible (not the detected family's)."""
    import torch

    return int(getattr(torch, spec.name).device_count())


def _bus_ids(spec: Any, devices: list[int], mode: str | None) -> list[str | None]:
    """Each CUDA device's PCI address (``0000:3b:00.0``) as CUDA reports it, for ``--cpu-binding``.

    Asked only where binding is on (it initialises CUDA in the launcher, after the fork server
    started); an NPU's comes from sysfs alone (torch-npu reports none), and so does any device
    whose properties lack it.
    """
    if spec.name != "cuda" or (mode or cpu_binding.default_mode(spec.name)) == "none":
        return []
    import torch

    found: list[str | None] = []
    for device in devices:
        try:
            props = torch.cuda.get_device_properties(device)
            found.append(f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0")
        except (AttributeError, RuntimeError, AssertionError):
            found.append(None)
    return found


@ports.released_on_error
def make_config(
    options: LaunchOptions | int | None = None,
    /,
    *,
    environ: dict[str, str] | None = None,
    before_device: Callable[[], Any] | None = None,
    identity: str = "",
    **given: Any,
) -> LaunchConfig:
    """Check the launcher's options and fill in what is missing; start nothing.

    Flags win; then the scheduler's environment and the rank table (:mod:`.schedulers`,
    :mod:`.ranktable`); then single-node defaults.

    Args:
        options: what the user asked for (:class:`.options.LaunchOptions`; an int is the process
            count). Keyword arguments named as its fields override it: ``make_config(nproc=2)``.
        environ: the environment to read the scheduler from (default: this process's).
        before_device: called after the checks that need no torch and before the device
            family is resolved (the launcher starts its fork server there).
        identity: what the job runs, the same on every node (:meth:`Target.identity`), for the
            default job id.

    Raises:
        LaunchUsageError: input that cannot work, as one line.
        LaunchError: a port already in use.
        UnknownDeviceError, DeviceUnavailableError: from the device layer.
        TypeError: a keyword that is no launch option.

    A port picked for a one-node job stays held (:mod:`.ports`) until the job's end calls
    :func:`.ports.release`; a refused job holds none.
    """
    opts = LaunchOptions.build(options, **given)
    environ = dict(os.environ if environ is None else environ)
    settled = rdzv_flags.settle(opts.rdzv_backend, opts.rdzv_endpoint, opts.rdzv_conf, opts.nnodes, opts.min_nodes,
                                opts.node_rank, opts.addr, opts.port, opts.join_timeout)
    keyword = opts.nproc if isinstance(opts.nproc, str) else None  # --nproc-per-node auto/cpu/gpu/npu/xpu
    plain = _plain_settings(None if keyword else opts.nproc, settled.nnodes, opts.node_rank, settled.addr, settled.port,
                            opts.max_restarts, environ, opts.rank_table_timeout, assign=settled.rdzv.assign,
                            standalone=opts.standalone)
    assign = plain.pop("assign")
    rdzv = replace(settled.rdzv, assign=assign, min_nodes=settled.rdzv.min_nodes if assign else None)
    found: schedulers.Detected = plain.pop("found")
    hccl_ports: hccl.PortRange = plain.pop("hccl_ports")
    port_from: str = plain.pop("port_from")
    nproc = plain.pop("nproc")
    ranks: tuple[int, ...] = plain.pop("ranks")
    opts.check()
    log_dir, device = opts.log_dir, torchrun_settings.nproc_family(keyword, opts.device)
    output = opts.output or OutputSettings()
    if nproc is not None:  # before the fork server starts, where the count is known already
        output.check(nproc, log_dir, plain["node_rank"])
    if before_device is not None:
        before_device()
    from npu_migrate import device as _device
    from npu_migrate.registry import ENV_DEVICE

    if device is None and not environ.get(ENV_DEVICE) and found.device:
        device = found.device  # an AscendJob, a rank table or a Ray NPU worker: the npu family
    spec = torchrun_settings.device_spec(keyword, device, _device.device_spec)
    count = _accelerators(spec) if spec.is_accelerator else 1
    if keyword is not None and not ranks:  # torchrun's determine_local_world_size, on this family
        nproc = count if spec.is_accelerator and keyword != "cpu" else cluster.node_cores()
    if nproc is None:
        nproc = count
    if spec.backend == hccl.BACKEND:  # its host ports are HCCL's, whatever the family is called
        control = plain["port"] + CONTROL_PORT_OFFSET if plain["nnodes"] > 1 else None
        hccl.check_launcher_ports(plain["port"], control, port_from, hccl_ports)
    if not spec.is_accelerator and nproc > CPU_PROCESSES_PER_CORE * cluster.node_cores():
        limit = CPU_PROCESSES_PER_CORE * cluster.node_cores()
        raise LaunchUsageError(
            f"--device-num {nproc} is more than {limit} CPU processes ({CPU_PROCESSES_PER_CORE} per core for the "
            f"{cluster.node_cores()} core(s) this process may use): CPU ranks are for tests; use {limit} or fewer.")
    if ranks and spec.is_accelerator and nproc > count:
        raise LaunchUsageError(
            f"the rank table {found.rank_table} lists {nproc} device(s) for this server, but {count} {spec.name} "
            f"device(s) are visible here ({spec.visible_devices_env}={environ.get(spec.visible_devices_env or '')!r}): "
            "the pod holds fewer NPUs than the table says.")
    if spec.is_accelerator and nproc > count:
        mask = environ.get(spec.visible_devices_env or "")
        seen = f" ({spec.visible_devices_env}={mask!r})" if mask is not None else ""
        raise LaunchUsageError(
            f"--device-num {nproc} is more than the {count} {spec.name} device(s) visible here{seen}. "
            f"Use --device-num {count} or fewer."
        )
    output.check(nproc, log_dir, plain["node_rank"])
    # torchrun gives every rank 1 thread; sharing the node's cores keeps a lone rank as fast as
    # plain python and several ranks from oversubscribing. The worker also calls
    # torch.set_num_threads: the fork server imported torch before this value existed.
    omp = None if "OMP_NUM_THREADS" in environ else max(1, cluster.node_cores() // nproc)
    backend = _device.default_backend(spec)
    net_env, net_note = cluster.network_env(plain["addr"], backend, environ, multi_node=plain["nnodes"] > 1)
    torchrun = torchrun_settings.settle(opts, spec, environ, nproc)
    mode = opts.cpu_binding or torchrun["torchrun"].numa_binding  # --numa-binding: torchrun's spelling
    devices = [torchrun["torchrun"].device_index(i) for i in range(nproc)] if spec.is_accelerator else list(range(nproc))
    binding = cpu_binding.plan_binding(mode, spec.name, devices, count if spec.is_accelerator else nproc, environ,
                                       bus_ids=_bus_ids(spec, devices, mode))
    return LaunchConfig(
        **torchrun, binding=binding,
        nproc=nproc, device=spec.name, backend=backend, log_dir=log_dir,
        max_restarts=opts.max_restarts, join_timeout=settled.join_timeout, omp_threads=omp,
        job_id=opts.job_id or default_job_id(plain["addr"], plain["port"], identity, environ),
        node_timeout=opts.node_timeout, net_env=tuple(sorted(net_env.items())), net_note=net_note,
        hang_timeout=effective_timeout(opts.hang_timeout, plain["nnodes"] * nproc), hang_action=opts.hang_action,
        error_file=os.path.abspath(opts.error_file) if opts.error_file else None, preflight=bool(opts.preflight),
        output=output, ranks=ranks, scheduler=found.scheduler.value,
        agreed=tuple(sorted(hccl.agreed_values(environ).items())), rank_table=found.rank_table, rdzv=rdzv, **plain,
    )



def world_table(cfg: LaunchConfig, target: Target) -> str:
    """The ``--dry-run`` text: every process of this node, its ranks, device, backend and variables."""
    nodes = f"{cfg.rdzv.min_nodes} to {cfg.nnodes}" if cfg.rdzv.min_nodes is not None else f"{cfg.nnodes}"
    lines = [
        f"world: {nodes} node(s) x {cfg.nproc} process(es)"
        + ("" if cfg.rdzv.assign else f" = {cfg.world_size} rank(s)")
        + f" on {cfg.device} with {cfg.backend}; master {cfg.addr}:{cfg.port}; settings from {cfg.sources}",
        f"target: {target.describe()}",
        f"job id: {cfg.job_id}; {cfg.net_note}",
        *([cfg.binding.note] if cfg.binding.note else []),
        "",
        f"{'node':>4}  {'local_rank':>10}  {'rank':>4}  {'device':<8}  backend",
    ]
    if cfg.rdzv.assign:  # the ranks follow from a node rank the rendezvous has not given yet
        return "\n".join([*lines[:lines.index("")], f"node rank: assigned at the {cfg.rdzv.backend} rendezvous (node 0 serves "
                          f"{cfg.addr}:{cfg.port}); rank = node rank x {cfg.nproc} + local rank"])
    for local in range(cfg.nproc):
        lines.append(f"{cfg.node_rank:>4}  {local:>10}  {cfg.rank(local):>4}  {cfg.device_of(local):<8}  {cfg.backend}")
    lines.append("")
    for local in range(cfg.nproc):
        env = " ".join(f"{k}={v}" for k, v in cfg.worker_env(local).items())
        lines.append(f"rank {cfg.rank(local)}: {env}")
    return "\n".join(lines)
