"""torchrun's command line in the launcher: the flags torchrun and torch_npu_run take that the launcher's
own flags did not already cover, their checks, and what each becomes here.

Usage::

    torchrun_flags.add_arguments(parser)            # from cli.add_arguments
    args = torchrun_flags.parse_args(parser, argv)  # `--tee SCRIPT`: the launcher's switch, then SCRIPT
    torchrun_flags.apply(args)                      # --standalone, --no-python with -m...: one line each

(``cli.LaunchParser`` and ``npu-migrate launch`` parse through :func:`parse_args`.)

Every flag of ``torch.distributed.run --help`` (torch 2.14) is accepted in each of torchrun's
spellings (``--flag-name``, ``--flag_name``, ``--flag=value``, ``-r3``); the rendezvous flags
(``--rdzv-*``, ``--nnodes MIN:MAX``) are :mod:`.rdzv`'. What each one does here is in its
help text and in docs/launch.md ("torchrun's command line"). In short:

* ``--standalone``: one node, this host, a free port on loopback, a new job id (torchrun's c10d on
  ``localhost:0``); a scheduler's node count, address or port is not read. ``--nnodes`` above 1 is
  refused.
* ``--nproc-per-node`` also takes ``auto``, ``cpu``, ``gpu``, ``npu`` and ``xpu``
  (:data:`NPROC_KEYWORDS`, counted in :func:`.config.make_config`).
* ``--no-python``: the target is an executable each rank runs with the rank's environment
  (:mod:`.executable`); ``--run-path``: the script is run with ``runpy.run_path``, as ranks run
  scripts here anyway.
* ``--redirects``/``--tee VALUE``/``--duplicate-*-filters``/``--logs-specs``: torchrun's log layout
  (:mod:`.logs`). ``--tee`` with no value stays the launcher's switch for ``--log-dir``.
* ``--role``, ``--monitor-interval``, ``--signals-to-handle``, ``--shutdown-timeout``,
  ``--virtual-local-rank``, ``--local-addr``, ``--event-log-handler``: as torchrun's agent uses them.
* ``--start-method``, ``--numa-binding``, ``--enable_tiered_parallel_tcpstore``: accepted with
  torchrun's (torch_npu_run's) values; their help says what differs here.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import uuid
from typing import Any, Callable, Sequence, TypeVar

from npu_migrate.launch.errors import LaunchUsageError
from npu_migrate.launch.torchrun.logs import filter_list, std_spec

NPROC_KEYWORDS = ("auto", "cpu", "gpu", "npu", "xpu")
"""``--nproc-per-node`` words (torchrun's, with ``npu`` as torch_npu registers it): ``auto`` the
devices of the family in use, else the CPUs; ``cpu`` the CPUs this process may use; ``gpu``, ``npu``,
``xpu`` the devices of that kind (refused where there are none)."""

START_METHODS = ("spawn", "fork", "forkserver")
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
"""torchrun's values (``torch.numa.binding.AffinityMode``, torch >= 2.9; a test compares)."""

DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""The signals the launcher handles and forwards to the ranks by default (torchrun's default)."""

SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
"""torchrun's variable for ``--shutdown-timeout`` when the flag is left out."""

PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
"""torchrun's variable for ``--log-line-prefix-template`` when the flag is left out."""

T = TypeVar("T")

TEE_SWITCH = True
"""``args.tee`` for ``--tee`` given without a value: the launcher's own switch (with ``--log-dir``)."""


def nproc_value(text: str) -> int | str:
    """``--nproc-per-node``'s argparse type: a number, or one of :data:`NPROC_KEYWORDS`."""
    word = text.strip().lower()
    if word in NPROC_KEYWORDS:
        return word
    try:
        return int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a process count: expected a number or one of {', '.join(NPROC_KEYWORDS)}") from None


def _stream_value(text: str) -> str:
    try:
        return std_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _filters(text: str) -> tuple[str, ...]:
    return tuple(item for item in filter_list(text) if item)  # torchrun: an empty list duplicates nothing


def signal_numbers(text: str) -> tuple[int, ...]:
    """``SIGTERM,SIGUSR1`` (``TERM`` too) as signal numbers; unknown names and SIGKILL/SIGSTOP refused."""
    numbers = []
    for item in text.split(","):
        name = item.strip().upper()
        if not name:
            continue
        full = name if name.startswith("SIG") else f"SIG{name}"
        sig = getattr(signal, full, None)
        if not isinstance(sig, signal.Signals) or full.startswith("SIG_"):
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not a signal name: expected names such as "
                                             f"{','.join(DEFAULT_SIGNALS)},SIGUSR1")
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise argparse.ArgumentTypeError(f"{full} cannot be handled by any process: leave it out")
        if int(sig) not in numbers:
            numbers.append(int(sig))
    if not numbers:
        raise argparse.ArgumentTypeError(f"{text!r} names no signal: expected e.g. {','.join(DEFAULT_SIGNALS)}")
    return tuple(numbers)


def _seconds(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} is negative: expected 0 or more seconds")
        return value

    parse.__name__ = f"{kind.__name__} seconds"
    return parse


def _true_false(text: str) -> str:
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return word


class _TeeTookWord(Exception):
    """``--tee`` (the launcher's switch) took the next word, which is no stream value: parse again.

    ``flags``: the spellings of the flag that took it; ``switch``: the word that replaces the flag.
    """

    def __init__(self, word: str, flags: tuple[str, ...] = ("--tee", "-t"), switch: str = "--tee=") -> None:
        super().__init__(word)
        self.word, self.flags, self.switch = word, flags, switch


class OptionalChoice(argparse.Action):
    """A flag whose value may be left out (``--cpu-binding``, ``--cpu-binding exclusive``): a next word that
    is none of its choices is the script's (``--cpu-binding train.py``), and the flag takes ``const``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is None or values == "":
            values = self.const
        elif values not in (self.metavar_choices or ()):
            if os.path.exists(values) or values.endswith(".py"):
                raise _TeeTookWord(values, tuple(self.option_strings), f"{self.option_strings[0]}=")
            raise argparse.ArgumentError(self, f"invalid choice: {values!r} (choose from "
                                               f"{', '.join(map(repr, self.metavar_choices or ()))})")
        setattr(namespace, self.dest, values)

    metavar_choices: tuple[str, ...] | None = None


class _Tee(argparse.Action):
    """``--tee``/``-t``: torchrun's ``--tee VALUE`` (:func:`.logs_layout.std_spec`), or, alone, the launcher's switch."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is None or values == "" or values is TEE_SWITCH:
            setattr(namespace, self.dest, TEE_SWITCH)
            return
        try:
            setattr(namespace, self.dest, std_spec(values))
        except ValueError as exc:
            if re.fullmatch(r"[\d:,]+", values):  # meant as a value: say what a value looks like
                raise argparse.ArgumentError(self, str(exc)) from None
            raise _TeeTookWord(values) from None


class _PrintCompletion(argparse.Action):
    """``--print-completion SHELL``: the completion script of this parser (``shtab``, optional, as torchrun)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            import shtab  # type: ignore[import-not-found]
        except ImportError:
            parser.exit(1, f"{option_string} requires the 'shtab' package: pip install shtab\n")
        print(shtab.complete(parser, shell=values))
        parser.exit()


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
               parse: Callable[[list[str]], T] | None = None) -> T:
    """``parser.parse_args(argv)``, with ``--tee SCRIPT`` read as the ``--tee`` switch followed by SCRIPT.

    ``--tee`` takes torchrun's optional value; where the word after it is none (``--log-dir logs
    --tee train.py``) it was the switch, and the line is parsed again with ``--tee=`` there.
    ``parse``: what parses a list of words (default ``parser.parse_args``); ``parser`` reports errors.
    """
    call = parse or parser.parse_args
    words = list(sys.argv[1:] if argv is None else argv)
    for _ in range(len(words) + 1):
        try:
            return call(words)  # type: ignore[return-value]
        except _TeeTookWord as took:
            at = next((i for i, w in enumerate(words[:-1]) if w in took.flags and words[i + 1] == took.word),
                      None)
            if at is None and took.flags[0] != "--tee":
                parser.error(f"argument {took.flags[0]}: invalid choice: {took.word!r}")
            if at is None:  # --tee=WORD: a value, and not one of torchrun's
                parser.error(f"argument -t/--tee: {took.word!r} is not a stream value: expected 0 (none), "
                             "1 (stdout), 2 (stderr) or 3 (both), or local-rank:value pairs such as 0:1,1:2")
            words[at] = took.switch
    return call(words)  # type: ignore[return-value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's flags that are not the launcher's own (:func:`.cli.add_arguments` adds those)."""
    parser.add_argument("--standalone", action="store_true",
                        help="torchrun's single-node job: this host only, a free port on loopback and a new job id; "
                             "a scheduler's node count, address or port is not read, and --master-addr, "
                             "--master-port, --rdzv-endpoint and --rdzv-id are ignored, as torchrun ignores them. "
                             "--nnodes above 1 is refused.")
    parser.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                        help="Run SCRIPT as an executable (found on PATH or by path), not a Python script: each "
                             "rank starts it with the rank's environment (RANK, LOCAL_RANK...), output and process "
                             "group, and ends with its exit code or signal. Not with -m.")
    parser.add_argument("--run-path", "--run_path", dest="run_path", action="store_true",
                        help="Run SCRIPT with runpy.run_path in the rank's interpreter, as torchrun's --run-path "
                             "does; ranks run scripts that way here anyway (with the script's directory on "
                             "sys.path, as `python SCRIPT`). Takes precedence over --no-python and -m.")
    parser.add_argument("--role", default="default",
                        help="The workers' role: ROLE_NAME in their environment and ${role_name} in "
                             "--log-line-prefix-template (default: %(default)s).")
    parser.add_argument("--monitor-interval", "--monitor_interval", dest="monitor_interval", type=_seconds(float),
                        default=None, metavar="SECONDS",
                        help="How often the launcher looks at signals, hangs and other nodes while the ranks run "
                             "(default: 0.05; a rank's exit is seen at once, whatever this is).")
    parser.add_argument("--start-method", "--start_method", dest="start_method", choices=START_METHODS,
                        default=None,
                        help="torchrun's way of starting workers; accepted, with no effect here: ranks are always "
                             "forked from the launcher's fork server (torch already imported), and inside a rank "
                             "multiprocessing's default start method is Python's, as under torchrun.")
    parser.add_argument("--event-log-handler", "--event_log_handler", dest="event_log_handler", default=None,
                        metavar="NAME",
                        help="Record torchelastic's events (each rank's START and its end state, the job's "
                             "SUCCEEDED or FAILED) through torch's event handler NAME "
                             "(torch.distributed.elastic.events: console, null...; default: null, none).")
    parser.add_argument("-r", "--redirects", dest="redirects", type=_stream_value, default=None, metavar="VALUE",
                        help="torchrun's: send streams of the ranks to files only: 1 stdout, 2 stderr, 3 both, "
                             "0 none, for every local rank, or per local rank as 0:1,1:2. The files are "
                             "LOG_DIR/<job id>_<random>/attempt_<restart>/<local rank>/stdout.log and stderr.log "
                             "(LOG_DIR: --log-dir, else a new torchelastic_* temporary directory), as torchrun "
                             "writes them.")
    parser.add_argument("-t", "--tee", dest="tee", action=_Tee, nargs="?", default=None, metavar="VALUE",
                        help="torchrun's --tee VALUE (--redirects' values): those streams go to their files in "
                             "torchrun's layout (see --redirects) and to the console. Without a value, the "
                             "launcher's switch: with --log-dir, also show every rank's output on the console.")
    parser.add_argument("--duplicate-stdout-filters", "--duplicate_stdout_filters", dest="stdout_filters",
                        type=_filters, default=None, metavar="A,B",
                        help="Copy the ranks' stdout lines shown on the console that contain A or B (,, for a "
                             "comma) to attempt_<restart>/filtered_stdout.log in torchrun's layout (see "
                             "--redirects; under torchrun only tee'd streams are filtered).")
    parser.add_argument("--duplicate-stderr-filters", "--duplicate_stderr_filters", dest="stderr_filters",
                        type=_filters, default=None, metavar="A,B",
                        help="The same for stderr, into attempt_<restart>/filtered_stderr.log.")
    parser.add_argument("--logs-specs", "--logs_specs", dest="logs_specs", default=None, metavar="NAME",
                        help="torchrun's plug-in for the log layout: the LogsSpecs class registered as entry point "
                             "NAME in the torchrun.logs_specs group decides every file of --redirects and --tee.")
    parser.add_argument("--local-addr", "--local_addr", dest="local_addr", default=None, metavar="ADDR",
                        help="This node's address in a multi-node rendezvous (default: the address of the interface "
                             "that reaches node 0), as torchrun's agent gives it to the rendezvous.")
    parser.add_argument("--numa-binding", "--numa_binding", dest="numa_binding", choices=NUMA_BINDINGS, default=None,
                        help="torchrun's (torch >= 2.9) binding of each rank to the CPUs near its device: the "
                             "launcher's --cpu-binding with that mode (which wins where both are given).")
    parser.add_argument("--signals-to-handle", "--signals_to_handle", dest="signals_to_handle", type=signal_numbers,
                        default=None, metavar="SIGNALS",
                        help="The signals that stop the job: the launcher forwards each to every rank's process "
                             "group, waits --shutdown-timeout, kills what is left and exits 128+N (default: "
                             f"{','.join(DEFAULT_SIGNALS)}, as torchrun; add SIGUSR1,SIGUSR2 for Slurm's warning "
                             "signals. With SIGUSR1 there, SIGUSR1 no longer prints the ranks' stacks).")
    parser.add_argument("--shutdown-timeout", "--shutdown_timeout", dest="shutdown_timeout", type=_seconds(int),
                        default=None, metavar="SECONDS",
                        help="Seconds between the signal that stops the ranks and SIGKILL (default: "
                             f"{SHUTDOWN_TIMEOUT_ENV}, else 5 after a failure and 3 after a signal to the "
                             "launcher; torchrun's default is 30).")
    parser.add_argument("--virtual-local-rank", "--virtual_local_rank", dest="virtual_local_rank",
                        action="store_true",
                        help="Each rank sees only its own device, as device 0: LOCAL_RANK=0 and the family's "
                             "visible-devices variable (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES) set to that "
                             "device, as torchrun does.")
    parser.add_argument("--enable_tiered_parallel_tcpstore", "--enable-tiered-parallel-tcpstore",
                        dest="tiered_tcpstore", type=_true_false, default=None, metavar="true|false",
                        help="torch_npu_run's per-node proxy between the ranks and the job's store; accepted, with "
                             "no effect: here every rank connects to the store node 0's launcher serves, and the "
                             "launchers of other nodes meet in a store of their own.")
    parser.add_argument("--print-completion", "--print_completion", action=_PrintCompletion,
                        choices=("bash", "zsh", "tcsh"),
                        help="Print a shell completion script for the launcher and exit (needs the optional "
                             "shtab package, as torchrun).")


def _one_node(nnodes: Any) -> bool:
    return nnodes is None or str(nnodes).strip() in ("1", "1:1")


def apply(args: argparse.Namespace) -> None:
    """Settle torchrun's flags on ``args`` before the options are read (:meth:`.options.LaunchOptions.from_args`).

    Raises:
        LaunchUsageError: flags that cannot go together, in one line.
    """
    if getattr(args, "standalone", False):
        nnodes, low = getattr(args, "nnodes", None), getattr(args, "min_nodes", None)
        if not _one_node(nnodes) or (low not in (None, 1)):
            given = f"{low}:{nnodes}" if low not in (None, nnodes) else nnodes
            raise LaunchUsageError(f"--standalone is one node on this host, but --nnodes {given} asks for more: drop "
                                   "--standalone and give node 0's address (--master-addr or --rdzv-endpoint).")
        args.nnodes, args.node_rank, args.addr, args.port = 1, None, "127.0.0.1", None
        args.job_id = str(uuid.uuid4())  # torchrun's, whatever --rdzv-id said
        for name in ("rdzv_backend", "rdzv_endpoint", "min_nodes"):
            if hasattr(args, name):
                setattr(args, name, None)
    if getattr(args, "no_python", False) and args.module and not getattr(args, "run_path", False):
        raise LaunchUsageError("--no-python runs an executable and -m a Python module: don't use both the "
                               "'--no-python' flag and the '--module' flag at the same time.")
    if args.prefix_template is None and os.environ.get(PREFIX_TEMPLATE_ENV) is not None:
        args.prefix_template = os.environ[PREFIX_TEMPLATE_ENV]
    if getattr(args, "shutdown_timeout", None) is None and os.environ.get(SHUTDOWN_TIMEOUT_ENV):
        try:
            args.shutdown_timeout = _seconds(int)(os.environ[SHUTDOWN_TIMEOUT_ENV])
        except argparse.ArgumentTypeError as exc:
            raise LaunchUsageError(f"{SHUTDOWN_TIMEOUT_ENV}={os.environ[SHUTDOWN_TIMEOUT_ENV]!r}: {exc}.") from exc
