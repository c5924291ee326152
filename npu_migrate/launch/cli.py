"""The launcher's command line: ``python -m npu_migrate.launch`` and ``npu-migrate launch``.

Usage::

    python -m npu_migrate.launch --device-num 8 train.py --epochs 10
    python -m npu_migrate.launch --device-num 8 --nnodes 2 --node-rank 0 --addr 10.0.0.1 train.py
    python -m npu_migrate.launch --dry-run --device-num 2 train.py     # print the world, start nothing
    python -m npu_migrate.launch --print-env train.py                  # which scheduler, from which variables

:func:`add_arguments` holds every flag (shared by both entry points; add new flags there; a
feature's flags come from its :class:`.features.LaunchFeature`), :func:`run` validates and starts
the job, :func:`main` parses and leaves the exit code to the command layer
(:func:`npu_migrate.argparsing.run_command`): 0 ok, 1 the job or the launcher failed, 2 bad input,
128+N signal N, 141 closed pipe.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import importlib.util
import os
import shlex
from typing import Any

from npu_migrate import autoload
from npu_migrate.argparsing import OneLineParser, run_command
from npu_migrate.launch import features
from npu_migrate.launch.nodes import secret
from npu_migrate.launch.procs import forkserver
from npu_migrate.launch.setup import ports
from npu_migrate.launch.torchrun import rdzv as rdzv_flags
from npu_migrate.launch.setup.config import make_config, world_table
from npu_migrate.launch.setup.ports import CONTROL_PORT_OFFSET, DEFAULT_PORT
from npu_migrate.launch.setup.target import Target
from npu_migrate.launch import signals
from npu_migrate.launch.setup import binding, hccl, ranktable, schedulers
from npu_migrate.launch.torchrun import executable, flags as torchrun_flags
from npu_migrate.launch.errors import LaunchUsageError, say
from npu_migrate.launch.procs.forkserver import start_fork_server, stop_fork_server
from npu_migrate.launch.setup.options import DEFAULT_HANG_TIMEOUT, DEFAULT_JOIN_TIMEOUT, DEFAULT_NODE_TIMEOUT, LaunchOptions
from npu_migrate.launch.setup.output_settings import DEFAULT_TEMPLATE
from npu_migrate.registry import FAMILY_CHOICES

PROG = "npu-migrate launch"
"""The prefix of the launcher's own lines and errors, under either entry point."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's flags; shared by ``python -m npu_migrate.launch`` and ``npu-migrate launch``."""
    parser.add_argument("--device-num", "--device_num", "--nproc-per-node", "--nproc_per_node", dest="nproc",
                        type=torchrun_flags.nproc_value, default=None, metavar="N|auto|cpu|gpu|npu",
                        help="Processes on this node, one per device (default: the devices of the family; 1 on CPU). "
                             "torchrun's words: auto (the family's devices, on CPU the CPUs this process may use), "
                             "cpu (that many CPU ranks), gpu or npu (every CUDA or NPU device, on that family); "
                             "xpu is refused (no launcher family).")
    parser.add_argument("--nnodes", "--world-size", "--world_size", dest="nnodes", action=rdzv_flags.NodeRange,
                        default=None, metavar="N|MIN:MAX",
                        help="Number of nodes; --world-size is accepted for scripts that call it that (default: 1, "
                             "or from Slurm/Kubeflow). MIN:MAX (with --rdzv-backend c10d and no --node-rank): wait "
                             "for MIN nodes, then up to last_call_timeout (--rdzv-conf) for more, up to MAX; the "
                             "world is fixed at that first rendezvous and restarts need the same nodes again. With "
                             "static, MIN:MAX waits for MAX nodes, as torchrun's static rendezvous does.")
    parser.set_defaults(min_nodes=None)  # set by --nnodes MIN:MAX
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=None,
                        help="Index of this node in [0, nnodes) (default: 0, or from Slurm/Kubeflow; with "
                             "--rdzv-backend c10d, assigned at the rendezvous: node 0 is the launcher that serves "
                             "the endpoint).")
    parser.add_argument("--addr", "--master-addr", "--master_addr", dest="addr", default=None,
                        help="Address of node 0; on node 0 it must be one of its own (default: 127.0.0.1, or from "
                             "Slurm/Kubeflow; --rdzv-endpoint's host where that is given).")
    parser.add_argument("--port", "--master-port", "--master_port", dest="port", type=int, default=None,
                        help=f"MASTER_PORT (default: a free port on one node, {DEFAULT_PORT} on several; "
                             f"multi-node launchers also use port + {CONTROL_PORT_OFFSET} for the rendezvous; "
                             "--rdzv-endpoint's port where that is given).")
    parser.add_argument("--device", default=None, choices=FAMILY_CHOICES,
                        help="Device family (default: NPU_MIGRATE_DEVICE, else detected; auto detects).")
    parser.add_argument("--log-dir", "--log_dir", dest="log_dir", default=None, metavar="DIR",
                        help="Write each global rank's stdout and stderr to DIR/rank{N}.log "
                             "(DIR/rank{N}.attempt{K}.log after restart K) instead of the console, which then "
                             "shows only the launcher's own lines; the launcher's details go to "
                             "DIR/launcher-node{K}.log. Logs of an earlier run there are refused (see --log-append). "
                             "With torchrun's --redirects or --tee VALUE, DIR holds torchrun's layout instead "
                             "(see --redirects).")
    parser.add_argument("--log-append", "--log_append", dest="log_append", action="store_true",
                        help="With --log-dir, append to rank logs an earlier run left there instead of refusing to start.")
    parser.add_argument("--log-line-prefix-template", "--log_line_prefix_template", dest="prefix_template",
                        default=None, metavar="TEMPLATE",
                        help="Prefix of every console line a rank writes, with ${rank}, ${local_rank}, "
                             "${node_rank}, ${host} (or torchrun's ${hostname}) and ${role_name}, e.g. "
                             "'[${rank}]: ' (else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, as torchrun). Default: "
                             f"'{DEFAULT_TEMPLATE}' when the job has more than one rank, none with one; "
                             "'' turns it off. Log files are never prefixed.")
    parser.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="ranks_filter", default=None,
                        metavar="RANKS",
                        help="Show only these local ranks' output on the console, e.g. 0,1 (default: all). "
                             "The others still go to their --log-dir files; without --log-dir their output is dropped.")
    parser.add_argument("--inherit-output", dest="inherit_output", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0,
                        help="Restart the whole job this many times after a failure or a lost node "
                             "(default: %(default)s).")
    parser.add_argument("--join-timeout", dest="join_timeout", type=float, default=DEFAULT_JOIN_TIMEOUT,
                        help="Seconds to wait for the other nodes' launchers (default: %(default)s).")
    parser.add_argument("--node-timeout", dest="node_timeout", type=float, default=DEFAULT_NODE_TIMEOUT,
                        help="Seconds without a node's heartbeat before it counts as lost and the job "
                             "ends or restarts (default: %(default)s).")
    parser.add_argument("--job-id", "--rdzv-id", "--rdzv_id", dest="job_id", default=None,
                        help="The job's token (torchrun's --rdzv-id), the same on every node; launchers of other "
                             "jobs on the same "
                             "address and port are refused (default: SLURM_JOB_ID, TORCHELASTIC_RUN_ID, or a "
                             "hash of --addr, --port and the script with its arguments).")
    parser.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default=None, metavar="BACKEND",
                        help="torchrun's rendezvous backend: static (the default: every node gives --node-rank; "
                             "--rdzv-endpoint is MASTER_ADDR:MASTER_PORT) or c10d (node 0 serves the rendezvous "
                             "at --rdzv-endpoint; without --node-rank each node gets its node rank there, and "
                             "--nnodes MIN:MAX is elastic). etcd and other backends are refused.")
    parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default=None,
                        metavar="HOST[:PORT]",
                        help="Node 0's address and port, the same on every node: --addr HOST --port PORT (PORT "
                             f"serves the ranks' store as MASTER_PORT, PORT + {CONTROL_PORT_OFFSET} the launchers'; "
                             f"default port with c10d: {rdzv_flags.C10D_DEFAULT_PORT}, as torchrun; 0 picks a free "
                             "one on a single node).")
    parser.add_argument("--rdzv-conf", "--rdzv_conf", dest="rdzv_conf", default=None, metavar="KEY=VALUE,...",
                        help="torchrun's rendezvous settings: join_timeout (= --join-timeout), last_call_timeout "
                             "(--nnodes MIN:MAX: how long to wait for more nodes once MIN are in; default "
                             f"{rdzv_flags.DEFAULT_LAST_CALL_TIMEOUT:g}), close_timeout, read_timeout (one call on "
                             "the launcher store), timeout (static: --join-timeout), is_host (c10d: this launcher "
                             "serves node 0's stores); heartbeat_timeout, keep_alive_interval, "
                             "keep_alive_max_attempt, use_libuv and store_type=tcp are accepted without effect "
                             "(liveness is --node-timeout). Unknown keys are refused.")
    parser.add_argument("--hang-timeout", "--hang_timeout", dest="hang_timeout", type=float, default=None,
                        help="Seconds without progress (no rank entering or leaving a collective while one "
                             "waits in one) before every rank's stack, collective and who is behind are "
                             f"printed; 0 turns it off (default: {DEFAULT_HANG_TIMEOUT:g} for more than one "
                             "rank, below NCCL's 10-minute and HCCL's 30-minute collective timeouts; off for one).")
    parser.add_argument("--hang-action", "--hang_action", dest="hang_action", choices=("end", "report"), default="end",
                        help="On a hang, end the job (exit 1) or only report it, once per stall "
                             "(default: %(default)s).")
    parser.add_argument("--error-file", "--error_file", dest="error_file", default=None,
                        help="Write a JSON report of every rank's exit status, signal, traceback, first failure "
                             "and hang to FILE when the job ends (also report-node{K}.json in --log-dir). "
                             "`kill -USR1 <launcher pid>` or `npu-migrate stacks PID` prints every rank's stack.")
    parser.add_argument("--secret-file", "--secret_file", dest="secret_file", default=None, metavar="FILE",
                        help="Sign every value of the launchers' store with the secret in FILE (mode 0600, the "
                             "same on every node; default: NPU_MIGRATE_JOB_SECRET, else none): a process "
                             "that reaches the port cannot then run code in, end or steer the job. See docs/security.md.")
    parser.add_argument("--preflight", action=argparse.BooleanOptionalAction, default=None,
                        help="Before the script, all-reduce once on the job's backend across every rank and "
                             "name the rank, host or interface that cannot be reached (default: off; it costs "
                             "one more start of the ranks' processes and a group join).")
    parser.add_argument("--dry-run", action="store_true",
                        help="Print every process's ranks, device, backend and environment; start nothing.")
    parser.add_argument("--print-env", "--print_env", dest="print_env", action="store_true",
                        help="Print which scheduler was detected (Slurm, AscendJob, Volcano, Kubeflow, Ray, "
                             "rank table) from which variables, HCCL's host ports and the HCCL variables every "
                             "node must share; start nothing and do not wait for a rank table.")
    parser.add_argument("--rank-table-timeout", "--rank_table_timeout", dest="rank_table_timeout", type=float,
                        default=None, metavar="SECONDS",
                        help="How long to wait for RANK_TABLE_FILE's status to become 'completed' (default: "
                             f"{ranktable.TIMEOUT_ENV}, else {ranktable.DEFAULT_TIMEOUT:g}: the operator writes it once "
                             "every pod has its NPUs).")
    bind = parser.add_argument(
        "--cpu-binding", "--cpu_binding", dest="cpu_binding", action=torchrun_flags.OptionalChoice, nargs="?",
        const="node", default=None, metavar="MODE",
        help="Run each rank on the CPUs near its device, intersected with the CPUs the launcher may use (taskset, "
             "a cgroup CPU set): node (its device's NUMA node; the default MODE), socket (the node's package), "
             "exclusive (a disjoint share of the node), core-complex (as exclusive), none. On CPU, disjoint shares "
             "of those CPUs. Threads follow each rank's set; on the NPU family CPU_AFFINITY_CONF tells torch-npu "
             "the same. Default: node on the NPU family (as torch-npu recommends), none elsewhere; a "
             "CPU_AFFINITY_CONF of your own wins. --numa-binding is torchrun's spelling.")
    bind.metavar_choices = binding.MODES
    parser.add_argument("-m", "--module", action="store_true",
                        help="Run SCRIPT as a module, like python -m.")
    torchrun_flags.add_arguments(parser)  # torchrun's other flags: --standalone, --no-python, --redirects...
    features.add_arguments(parser)  # --migrate, --probe DIR, --strict-ops... (npu_migrate.launch.features)
    parser.add_argument("script", metavar="SCRIPT", help="The training script (or module with -m).")
    parser.add_argument("script_args", metavar="ARGS", nargs=argparse.REMAINDER,
                        help="Arguments for the script, passed through untouched.")


class LaunchParser(OneLineParser):
    """The launcher's parser: ``--tee SCRIPT`` is the ``--tee`` switch before SCRIPT (:func:`.torchrun_flags.parse_args`)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parse = super().parse_known_args
        return torchrun_flags.parse_args(self, args, lambda words: parse(words, copy.copy(namespace)))


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``launch`` to ``subparsers`` (or make the stand-alone parser)."""
    description = "Start one process per device on this node; all of them end when one fails."
    # No abbreviations: argparse classifies every word, the script's own arguments included, and
    # a script flag that abbreviates launcher flags (`--hang` for --hang-timeout/--hang-action)
    # would be refused as ambiguous instead of reaching the script.
    if subparsers is None:
        parser = LaunchParser(prog="python -m npu_migrate.launch", description=description, allow_abbrev=False)
    else:
        parser = subparsers.add_parser("launch", help="Run a training script on every device.",
                                       description=description, allow_abbrev=False)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def print_env(environ: dict[str, str]) -> str:
    """``--print-env``: the scheduler and the variables it was read from, the rank table, the CPUs and
    NUMA nodes binding divides (:mod:`.setup.binding`), HCCL's ports."""
    try:
        found = schedulers.detect(environ)
        ports = hccl.host_ports(environ)
    except ValueError as exc:
        raise LaunchUsageError(f"could not read the cluster environment: {exc}.") from exc
    lines = [schedulers.describe(found)]
    if found.rank_table:
        try:
            table, status = ranktable.read_once(found.rank_table)
        except ranktable.RankTableError as exc:
            table, status = None, str(exc)
        lines.append(f"rank table {found.rank_table}: {status}")
        if table is not None:
            lines += [f"  server {s.index} {s.name()}: devices {','.join(map(str, s.device_ids))} -> ranks "
                      f"{','.join(map(str, s.ranks))}" for s in table.servers]
    lines.append(binding.describe_host(environ))
    lines.append(f"HCCL host ports: {ports.describe()}; the launcher's ports stay outside them")
    lines.append("HCCL variables every node must share: "
                 + ", ".join(f"{k}={v or '(unset)'}" for k, v in hccl.agreed_values(environ).items()))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Validate, then launch (or print the world with --dry-run); the fork server is stopped on any error."""
    signals.answer_sigint()
    try:
        return _run(args)
    except BaseException:
        stop_fork_server()  # it holds our stdout and stderr: a reader would wait for it
        raise


def _target(args: argparse.Namespace) -> Target:
    if args.no_python and not args.run_path:  # torchrun: --run-path takes precedence
        shown = " ".join(shlex.quote(str(a)) for a in [args.script, *args.script_args])
        return Target(fn=executable.run, args=(executable.find(args.script), *args.script_args), shown=shown)
    if args.module and not args.run_path:
        if importlib.util.find_spec(args.script.split(".")[0]) is None:
            raise LaunchUsageError(f"module {args.script!r} not found: check the name and that it is importable from here.")
        return Target(module=args.script, args=tuple(args.script_args))
    if not os.path.isfile(args.script):
        raise LaunchUsageError(f"script {args.script!r} not found (working directory {os.getcwd()}).")
    return Target(script=args.script, args=tuple(args.script_args))


def _run(args: argparse.Namespace) -> int:
    from npu_migrate.launch.procs.supervisor import run_job

    if args.print_env:
        print(print_env(dict(os.environ)))
        return 0
    torchrun_flags.apply(args)  # --standalone, --no-python with -m, torchrun's variables
    target = _target(args)
    # Read once, then out of the environment the fork server and the workers inherit.
    job_secret = secret.load_secret(args.secret_file)
    if os.environ.get(secret.SECRET_ENV) and not args.dry_run and getattr(args, "command_line", False):
        # Out of this process's own environment too (what `ps e` shows): returns where it cannot.
        secret.run_again_without(None if args.secret_file else job_secret, forkserver.initial_environ())
    secret.use_secret(job_secret)
    os.environ.pop(secret.SECRET_ENV, None)
    os.environ.pop(secret.FD_ENV, None)
    options = LaunchOptions.from_args(args)
    jobs = features.jobs_for(args)  # every feature checks its flags before anything starts
    exported: frozenset[str] = frozenset()
    if not args.dry_run:
        # Before the fork server starts: it imports torch, and the features must be armed there.
        exported = features.prepare(jobs)
    arm = features.fork_server_arming(jobs)
    methods: list[str] = []
    try:
        cfg = make_config(options, identity=target.identity(), before_device=None if args.dry_run else
                          lambda: methods.append(start_fork_server(exported, arm)))
    except BaseException:
        features.discard(jobs)  # refused (or interrupted) before the job: no worker will use what they made
        raise
    if args.dry_run:
        ports.release(cfg.port)  # nothing will serve it
        print(world_table(cfg, target))
        return 0
    notes = "".join(f", {note}" for note in (job.describe(cfg.device) for job in jobs) if note)
    if cfg.binding.note:
        notes += f", {cfg.binding.note}"
    hccl_note = hccl.connect_timeout_note(cfg.backend, cfg.nnodes, dict(os.environ))
    if hccl_note:  # the one line that says the launcher set HCCL_CONNECT_TIMEOUT for a large job
        notes += f", {hccl_note}"
    counts = sorted(set(cfg.binding.threads)) if cfg.binding.threads and cfg.omp_threads else [cfg.omp_threads]
    threads = f", {'/'.join(map(str, counts))} thread(s) per rank" if cfg.omp_threads else ""
    where = cfg.rdzv.describe(cfg.nnodes) if cfg.rdzv.assign else f"node {cfg.node_rank} of {cfg.nnodes}"
    say(f"{where}: {cfg.nproc} process(es) on {cfg.device} with {cfg.backend}, "
        f"master {cfg.addr}:{cfg.port}, {cfg.net_note}{threads} (settings from {cfg.sources}){notes}")
    code: int | None = None
    try:
        code = run_job(cfg, target, methods[0])
    finally:
        code = features.finish(jobs, code, say)
    return int(code or 0)


def main(argv: list[str] | None = None) -> int:
    """``python -m npu_migrate.launch``: the same job, lines and exit codes as ``npu-migrate launch``."""
    args = build_parser().parse_args(argv)  # a usage error: argparse's line and SystemExit(2)
    args.command_line = argv is None  # this process's own command line: it may run it again (.secret)
    if not faulthandler.is_enabled():  # a crash of the launcher itself shows where it was
        faulthandler.enable()

    def body() -> int:
        autoload.disable_unless_needed(args.device)
        autoload.check_versions()
        return run(args)

    return run_command(PROG, body, explain=autoload.explain)
