"""torchrun's log layout: ``--redirects``, ``--tee VALUE``, ``--duplicate-*-filters`` and ``--logs-specs``.

Usage::

    logs = TorchrunLogs(redirects="3", tee="0:1", stdout_filters=("loss",))   # checked flags (:func:`std_spec`)
    specs = make_specs(logs, log_dir="logs", ranks_filter={0})   # once per job: torch's LogsSpecs (or the plug-in)
    dest = destinations(specs, envs)    # per attempt: each local rank's files and console, TORCHELASTIC_ERROR_FILE

What torchrun does, and so what the launcher does with these flags (``torch/distributed/run.py``,
``torch/distributed/elastic/multiprocessing/api.py``):

* ``--redirects``/``-r`` and ``--tee``/``-t`` take a stream value for every local rank (``0`` none,
  ``1`` stdout, ``2`` stderr, ``3`` both) or a per-local-rank map ``0:1,1:2`` (:func:`std_spec`;
  torch's ``Std.from_str`` formats). A redirected stream goes to its file only; a tee'd one to its
  file and the console; the others to the console.
* The files are ``LOG_DIR/<run id>_<random>/attempt_<restart>/<local rank>/stdout.log``,
  ``stderr.log`` and ``error.json`` (the rank's ``TORCHELASTIC_ERROR_FILE``), and
  ``attempt_<restart>/filtered_stdout.log`` / ``filtered_stderr.log`` for the duplicate filters.
  Without ``--log-dir`` the root is a new ``torchelastic_*`` directory in the temporary directory.
  This is torch's ``DefaultLogsSpecs`` (used where torch has it; :class:`Layout` writes the same
  layout on older torch).
* ``--duplicate-stdout-filters a,b`` copies the console lines of stdout that contain ``a`` or ``b``
  (with their prefix) to ``filtered_stdout.log``; ``,,`` is a comma inside a filter.
* ``--logs-specs NAME`` replaces the layout with the class registered as entry point ``NAME`` in the
  ``torchrun.logs_specs`` group (a ``LogsSpecs`` subclass), as torchrun does.

The relay (:mod:`..procs.output`) writes what :func:`destinations` says; ``--local-ranks-filter`` is part of
it (a filtered rank's tee'd streams go to their files only, its console streams nowhere). Without
any of these flags the launcher keeps its own layout (``--log-dir DIR``: ``DIR/rank{N}.log``).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from npu_migrate.launch.errors import LaunchUsageError

STD_VALUE = re.compile(r"^[0123]$")
STD_MAPPING = re.compile(r"^(\d:[0123],)*(\d:[0123])$")
"""torch's ``Std.from_str`` formats (``_VALUE_REGEX``, ``_MAPPING_REGEX``): one digit per local rank."""

OUT, ERR = 1, 2
"""torch's ``Std.OUT`` and ``Std.ERR`` bits."""

ENTRY_POINT_GROUP = "torchrun.logs_specs"
"""Where ``--logs-specs NAME`` looks ``NAME`` up, as torchrun does."""

CONSOLE = ""
"""A destination that is the console (torch's ``SYS_STREAM``)."""


def std_spec(text: str) -> str:
    """``text`` if it is one of torchrun's stream values (``3``, ``0:1,1:2``), else ValueError."""
    if not (STD_VALUE.match(text) or STD_MAPPING.match(text)):
        raise ValueError(f"{text!r} is not a stream value: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), "
                         "or local-rank:value pairs such as 0:1,1:2")
    return text


def std_map(spec: str, nproc: int) -> dict[int, int]:
    """The stream bits of each local rank (torch's ``to_map(Std.from_str(spec), nproc)``)."""
    if STD_VALUE.match(spec):
        return dict.fromkeys(range(nproc), int(spec))
    given = {int(k): int(v) for k, v in (item.split(":") for item in spec.split(","))}
    return {local: given.get(local, 0) for local in range(nproc)}


def filter_list(text: str) -> list[str]:
    """torchrun's ``--duplicate-*-filters`` value: comma-separated, ``,,`` for a comma inside one."""
    placeholder = "\0"
    return [item.replace(placeholder, ",") for item in text.replace(",,", placeholder).split(",")]


@dataclass(frozen=True)
class TorchrunLogs:
    """torchrun's log flags, as given (checked by :func:`std_spec` where they enter).

    Attributes:
        redirects: ``--redirects`` (``"0"``: none).
        tee: ``--tee VALUE`` (``"0"``: none; the launcher's own ``--tee`` switch is not this).
        stdout_filters: ``--duplicate-stdout-filters``; empty: nothing is duplicated.
        stderr_filters: ``--duplicate-stderr-filters``.
        specs: ``--logs-specs``, an entry point name of :data:`ENTRY_POINT_GROUP` (None: torch's default).
    """

    redirects: str = "0"
    tee: str = "0"
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()
    specs: str | None = None

    @property
    def active(self) -> bool:
        """Whether torchrun's layout is asked for (any stream redirected or tee'd, a filter, a plug-in)."""
        bits = [*std_map(self.redirects, 10).values(), *std_map(self.tee, 10).values()]  # one digit per rank
        return any(bits) or bool(self.stdout_filters or self.stderr_filters) or self.specs is not None

    def check(self) -> None:
        """A ``--logs-specs`` name that no installed package registers is refused (torchrun's error, one line).

        Raises:
            LaunchUsageError: naming the group and the names it has.
        """
        if self.specs is None:
            return
        found = _entry_points()
        if self.specs not in found:
            names = ", ".join(sorted(found)) or "none is installed"
            raise LaunchUsageError(f"--logs-specs {self.specs!r}: could not find entrypoint under "
                                   f"'{ENTRY_POINT_GROUP}[{self.specs}]' key (registered: {names}).")


def _entry_points() -> dict[str, Any]:
    eps = metadata.entry_points()
    group = eps.select(group=ENTRY_POINT_GROUP) if hasattr(eps, "select") else eps.get(ENTRY_POINT_GROUP, ())
    return {ep.name: ep for ep in group}


class Layout:
    """torch's ``DefaultLogsSpecs`` layout, for a torch that has none (its ``reify`` contract, same paths).

    ``<root>/<run id>_<random>/attempt_<K>/<local rank>/{stdout,stderr}.log`` and ``error.json``;
    the root is made if missing, or is a new ``torchelastic_*`` temporary directory.
    """

    def __init__(self, log_dir: str | None = None, redirects: Any = 0, tee: Any = 0,
                 local_ranks_filter: set[int] | None = None) -> None:
        if not log_dir:
            log_dir = tempfile.mkdtemp(prefix="torchelastic_")
        elif os.path.isfile(log_dir):
            raise NotADirectoryError(f"log_dir: {log_dir} is a file")
        os.makedirs(log_dir, exist_ok=True)
        self._root_log_dir = log_dir
        self._redirects, self._tee, self._local_ranks_filter = redirects, tee, local_ranks_filter
        self._run_log_dir: str | None = None

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def reify(self, envs: dict[int, dict[str, str]]) -> Any:
        nprocs = len(envs)
        first = envs[0] if nprocs else {}
        if self._run_log_dir is None:
            self._run_log_dir = tempfile.mkdtemp(prefix=f"{first.get('TORCHELASTIC_RUN_ID', 'test_run_id')}_",
                                                 dir=self._root_log_dir)
        attempt = os.path.join(self._run_log_dir, f"attempt_{first.get('TORCHELASTIC_RESTART_COUNT', '0')}")
        shutil.rmtree(attempt, ignore_errors=True)
        os.makedirs(attempt)
        redirs = _to_map(self._redirects, nprocs)
        tees = _to_map(self._tee, nprocs)
        dest = _Dest(filtered_stdout=os.path.join(attempt, "filtered_stdout.log"),
                     filtered_stderr=os.path.join(attempt, "filtered_stderr.log"))
        shown = self._local_ranks_filter
        for local in range(nprocs):
            rank_dir = os.path.join(attempt, str(local))
            os.mkdir(rank_dir)
            redirect, tee = redirs[local] | tees[local], tees[local]
            for bit, name, files, teed in ((OUT, "stdout", dest.stdouts, dest.tee_stdouts),
                                           (ERR, "stderr", dest.stderrs, dest.tee_stderrs)):
                files[local] = os.path.join(rank_dir, f"{name}.log") if redirect & bit else CONSOLE
                if tee & bit and not (shown and local not in shown):
                    teed[local] = files[local]
                if shown and local not in shown and files[local] == CONSOLE:
                    files[local] = os.devnull
            dest.error_files[local] = os.path.join(rank_dir, "error.json")
            envs[local]["TORCHELASTIC_ERROR_FILE"] = dest.error_files[local]
        return dest


@dataclass
class _Dest:
    """torch's ``LogsDest``: local rank -> path ("" the console, os.devnull nowhere)."""

    stdouts: dict[int, str] = None  # type: ignore[assignment]
    stderrs: dict[int, str] = None  # type: ignore[assignment]
    tee_stdouts: dict[int, str] = None  # type: ignore[assignment]
    tee_stderrs: dict[int, str] = None  # type: ignore[assignment]
    error_files: dict[int, str] = None  # type: ignore[assignment]
    filtered_stdout: str = ""
    filtered_stderr: str = ""

    def __post_init__(self) -> None:
        for name in ("stdouts", "stderrs", "tee_stdouts", "tee_stderrs", "error_files"):
            if getattr(self, name) is None:
                setattr(self, name, {})


def _to_map(value: Any, nproc: int) -> dict[int, int]:
    if isinstance(value, dict):
        return {local: int(value.get(local, 0)) for local in range(nproc)}
    return dict.fromkeys(range(nproc), int(value))


def _torch_std(spec: str) -> Any:
    """``spec`` as torch's ``Std`` value or map (for a LogsSpecs class of torch or a plug-in)."""
    from torch.distributed.elastic.multiprocessing.api import Std

    return Std.from_str(spec)


def specs_class(name: str | None) -> Any:
    """The LogsSpecs class: the ``--logs-specs`` plug-in, else torch's ``DefaultLogsSpecs`` (else :class:`Layout`)."""
    if name is not None:
        return _entry_points()[name].load()
    try:
        from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest
    except ImportError:  # torch < 2.3: no LogsSpecs yet
        return Layout
    if "filtered_stdout" not in getattr(LogsDest, "__dataclass_fields__", {}):
        return Layout  # torch before the duplicate filters: the same layout, with their files
    return DefaultLogsSpecs


def make_specs(logs: TorchrunLogs, log_dir: str | None, ranks_filter: frozenset[int] | None) -> Any:
    """One job's LogsSpecs object (it makes the run's log directory at its first attempt)."""
    cls = specs_class(logs.specs)
    if cls is Layout:
        redirects: Any = std_map_or_value(logs.redirects)
        tee: Any = std_map_or_value(logs.tee)
    else:
        redirects, tee = _torch_std(logs.redirects), _torch_std(logs.tee)
    return cls(log_dir=log_dir, redirects=redirects, tee=tee,
               local_ranks_filter=set(ranks_filter) if ranks_filter else None)


def std_map_or_value(spec: str) -> Any:
    """``"3"`` -> 3, ``"0:1,1:2"`` -> ``{0: 1, 1: 2}`` (:class:`Layout`'s form of torch's ``Std``)."""
    if STD_VALUE.match(spec):
        return int(spec)
    return {int(k): int(v) for k, v in (item.split(":") for item in spec.split(","))}


@dataclass(frozen=True)
class Stream:
    """Where one stream of one local rank goes: a file (or None), and whether the console shows it."""

    file: str | None
    console: bool


@dataclass(frozen=True)
class Destinations:
    """One attempt's files: each local rank's stdout and stderr, error file, and the filtered files.

    Attributes:
        out, err: per local rank, where stdout and stderr go.
        error_files: per local rank, its ``TORCHELASTIC_ERROR_FILE``.
        filtered_stdout, filtered_stderr: the duplicate filters' files ("" for none).
        run_dir: the run's log directory (``<root>/<run id>_<random>``), for the launcher's line.
    """

    out: tuple[Stream, ...]
    err: tuple[Stream, ...]
    error_files: tuple[str, ...]
    filtered_stdout: str
    filtered_stderr: str
    run_dir: str

    def log_of(self, local: int) -> str | None:
        """The file that holds a failed rank's traceback (stderr's, else stdout's), or None."""
        return self.err[local].file or self.out[local].file


def _stream(path: str, teed: bool) -> Stream:
    if path == CONSOLE:
        return Stream(None, True)
    if path == os.devnull:
        return Stream(None, False)
    return Stream(path, teed)


def destinations(specs: Any, envs: dict[int, dict[str, str]]) -> Destinations:
    """Ask ``specs`` (a LogsSpecs object) for this attempt's files; ``envs`` is each local rank's environment."""
    dest = specs.reify(envs)
    nproc = len(envs)
    out = tuple(_stream(dest.stdouts.get(local, CONSOLE), local in dest.tee_stdouts) for local in range(nproc))
    err = tuple(_stream(dest.stderrs.get(local, CONSOLE), local in dest.tee_stderrs) for local in range(nproc))
    errors = tuple(dest.error_files.get(local, "") for local in range(nproc))
    sample = next((e for e in errors if e and e != os.devnull), "")
    run_dir = os.path.dirname(os.path.dirname(os.path.dirname(sample))) if sample else specs.root_log_dir
    return Destinations(out, err, errors, getattr(dest, "filtered_stdout", ""), getattr(dest, "filtered_stderr", ""),
                        run_dir)
