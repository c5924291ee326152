"""The probe file format: one JSON object per line in ``DIR/rank{R}.jsonl``, and its reader.

Usage::

    rec = records.read_rank_file("runs/gpu/rank0.jsonl")
    rec.header["device"], rec.steps[12]["loss"], rec.modules[12]

Every line has a ``kind``:

* ``header``: written when the process makes its first record: ``format``, ``rank``, ``world_size``,
  ``device``, ``default_dtype``, ``seed``, ``versions``, ``settings``, ``host``, ``time``... With
  ``--probe-append`` a later run adds another header, and its records follow it.
* ``step``: at every optimizer step: ``step`` (1-based), ``loss`` (the mean of the scalars that
  backward passes started from since the previous step), ``backwards`` (how many), ``grad_norm``
  (L2 norm of every gradient the optimizer holds, before the step), ``lr`` (first parameter
  group) and ``autocast`` (the autocast dtype seen in that step's forward passes, or null).
* ``layout``: ``id`` and ``entries``: one ``[module, call, phase, slot, dtype, shape]`` per tensor
  of a step's module record, in the order they were produced. ``call`` counts the calls of the
  module within the step (0 first); ``phase`` is ``forward`` or ``backward``; ``slot`` is
  ``input.I``, ``output.I``, ``grad_output.I``, ``grad_input.I`` or ``grad.PARAM``. Written once
  per distinct layout.
* ``modules``: ``step``, ``layout`` (an id above) and ``stats``: base64 of little-endian float64,
  ``len(STAT_FIELDS)`` numbers per entry (min, max, mean, L2 norm, NaN count, Inf count,
  computed in float32 or wider). Binary so that a 10,000-step recording of 100 modules is read in
  seconds; :func:`decode_stats` turns it back into numbers.
* ``end``: written when the process exits: how many records were made and which filter
  matched nothing.

Lines are written whole and flushed one by one, so a crash keeps every line written before it;
a torn last line is skipped with a note.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

FORMAT = "npu_migrate.probe/1"
STAT_FIELDS = ("min", "max", "mean", "norm", "nan", "inf")
NSTATS = len(STAT_FIELDS)
STEP_METRICS = ("loss", "grad_norm", "lr")


@dataclass(frozen=True)
class Entry:
    """Where one tensor of a module record comes from.

    Attributes:
        module: module name (``conv1``, ``layer1.0.bn1``; the root module is its class name).
        call: index of the module's call within the step (0 for the first).
        phase: ``forward`` or ``backward``.
        slot: ``input.I``, ``output.I``, ``grad_output.I``, ``grad_input.I`` or ``grad.PARAM``.
        dtype: torch dtype name without ``torch.``.
        shape: tensor shape.
    """

    module: str
    call: int
    phase: str
    slot: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def key(self) -> tuple[str, int, str, str]:
        """What aligns this entry with the other run's."""
        return (self.module, self.call, self.phase, self.slot)

    @property
    def label(self) -> str:
        """``module[#call] phase slot`` for reports."""
        call = f"#{self.call}" if self.call else ""
        return f"{self.module}{call} {self.phase} {self.slot}"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class RankRecording:
    """Everything one rank file holds.

    Attributes:
        rank: the rank in the file name.
        path: the file.
        header: the first header; ``headers`` has every one (more than one with --probe-append).
        steps: ``{step: {"loss": ..., "grad_norm": ..., "lr": ...}}``; a repeated step keeps the last.
        autocast: ``{step: dtype}`` for steps whose forward ran under autocast.
        float32_math: ``{step: format}`` for steps whose float32 convolutions or matrix products ran in a
            narrower format (``tfloat32``, ``hfloat32``: :func:`npu_migrate.compare.recording.stats.float32_math`).
        modules: ``{step: (entries, raw float64 bytes)}``.
        end: the ``end`` record, or ``None`` when the process did not exit cleanly.
        notes: lines that could not be read, and why.
    """

    rank: int
    path: str
    header: dict[str, Any] = field(default_factory=dict)
    headers: list[dict[str, Any]] = field(default_factory=list)
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    autocast: dict[int, str] = field(default_factory=dict)
    float32_math: dict[int, str] = field(default_factory=dict)
    modules: dict[int, tuple[tuple[Entry, ...], bytes]] = field(default_factory=dict)
    end: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def encode_stats(values: Sequence[float]) -> str:
    """Pack numbers as base64 little-endian float64 (the ``stats`` of a ``modules`` line)."""
    data = array("d", values)
    if struct.pack("=d", 1.0) != struct.pack("<d", 1.0):  # pragma: no cover - big-endian hosts
        data.byteswap()
    return base64.b64encode(data.tobytes()).decode("ascii")


def decode_stats(raw: bytes) -> array:
    """Numbers of a ``modules`` line's decoded ``stats`` (``len(entries) * NSTATS`` of them)."""
    data = array("d")
    data.frombytes(raw)
    if struct.pack("=d", 1.0) != struct.pack("<d", 1.0):  # pragma: no cover - big-endian hosts
        data.byteswap()
    return data


def layout_line(layout_id: int, entries: Sequence[tuple[str, int, str, str, str, tuple[int, ...]]]) -> dict[str, Any]:
    """The ``layout`` record for ``entries``."""
    return {"kind": "layout", "id": layout_id, "fields": list(STAT_FIELDS),
            "entries": [[m, c, p, s, d, list(shape)] for m, c, p, s, d, shape in entries]}


class RecordError(ValueError):
    """A line of a rank file that is not what the probe writes: ``path:line: what is wrong``."""


MAX_TEXT = 200
"""Characters kept of any text a recording holds (names, versions, hosts): a recording may come
from another machine or user, so its text is data, stripped of control characters and bounded."""

MAX_DEPTH = 8
"""Nesting kept of header values (``versions``, ``settings``); deeper values become ``"..."``."""

_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError)
"""What a malformed or hostile line can raise while it is parsed and checked: each becomes one
:class:`RecordError` naming the file and line (``json.loads`` raises RecursionError on deep nesting)."""


def clean(value: Any, depth: int = 0) -> Any:
    """``value`` from a recording, safe to keep and print: strings through ``printable``, depth bounded."""
    from npu_migrate.textsafe import printable

    if isinstance(value, str):
        return printable(value, MAX_TEXT)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= MAX_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {printable(k, MAX_TEXT): clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v, depth + 1) for v in value]
    return printable(value, MAX_TEXT)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, expected a string")
    return clean(value)


def _step_number(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"step {value!r} is not a step number (a non-negative integer)")
    return value


def _header(obj: dict[str, Any]) -> dict[str, Any]:
    header = clean(obj)
    for key in ("device", "default_dtype", "format"):
        if key in header and header[key] is not None:
            _text(header[key], f"{key!r}")
    for key in ("versions", "settings"):
        if key in header and not isinstance(header[key], dict):
            raise TypeError(f"{key!r} is {type(header[key]).__name__}, expected an object")
    return header


def _layout(obj: dict[str, Any]) -> tuple[Entry, ...]:
    entries = []
    for item in obj["entries"]:
        m, c, p, s, d, shape = item
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
            raise TypeError(f"shape {clean(shape)!r} is not a list of integers")
        entries.append(Entry(_text(m, "module"), _step_number(c), _text(p, "phase"), _text(s, "slot"),
                             _text(d, "dtype"), tuple(shape)))
    return tuple(entries)


def read_rank_file(path: str, rank: int) -> RankRecording:
    """Read one ``rank{R}.jsonl``, tolerating a torn line left by a crash.

    A line that is not JSON is skipped with a note where a crash could have torn it: as the
    last line, or just before the header of a run that appended to the file. Any other
    malformed line (not JSON elsewhere, nested too deeply, a missing key, a value of the wrong
    type) stops the reading. Text is kept through :func:`clean`.

    Raises:
        RecordError: one line, ``path:line: what is wrong``, for the first malformed line.
        ValueError: the file is not a probe recording.
    """
    rec = RankRecording(rank=rank, path=path)
    layouts: dict[tuple[int, int], tuple[Entry, ...]] = {}
    session = -1
    torn: tuple[int, str] | None = None  # a line that was not JSON: fine only if a crash explains it
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if len(line) < 3 and not line.strip():
                continue
            try:
                obj = _fast_modules(line) if line.startswith(_MODULES_PREFIX) else None
                if obj is None:
                    obj = json.loads(line)
            except (ValueError, RecursionError) as exc:
                if torn is not None:
                    raise _bad(path, torn[0], torn[1]) from exc
                torn = (number, "not JSON" if isinstance(exc, ValueError) else "JSON nested too deeply")
                if isinstance(exc, RecursionError):
                    raise _bad(path, *torn) from exc
                continue
            try:
                if not isinstance(obj, dict):
                    raise TypeError(f"a JSON {type(obj).__name__}, expected an object")
                kind = obj["kind"]
                if torn is not None:
                    if kind != "header":
                        raise _bad(path, torn[0], torn[1])
                    rec.notes.append(f"{path}:{torn[0]}: unreadable line skipped (torn by a crash?)")
                    torn = None
                session = _read_line(rec, layouts, session, obj, path, number)
            except RecordError:
                raise
            except _UNREADABLE as exc:
                raise _bad(path, number, _reason(exc)) from exc
    if torn is not None:
        rec.notes.append(f"{path}:{torn[0]}: unreadable line skipped (torn by a crash?)")
    if not rec.headers:
        raise ValueError(f"{path} has no probe header: expected a first line with \"kind\": \"header\" "
                         "written by --probe")
    return rec


def _reason(exc: BaseException) -> str:
    from npu_migrate.textsafe import printable

    if isinstance(exc, KeyError):
        return f"no {printable(exc.args[0] if exc.args else '', 80)!r} field"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return printable(str(exc), 200) or type(exc).__name__


def _bad(path: str, number: int, reason: str) -> RecordError:
    return RecordError(f"{path}:{number}: not a probe record ({reason}). Each line must be a JSON object as "
                       "--probe writes it (see npu_migrate.compare.records); re-record the run, or remove the line.")


def _read_line(rec: RankRecording, layouts: dict[tuple[int, int], tuple[Entry, ...]], session: int,
               obj: dict[str, Any], path: str, number: int) -> int:
    """Add one parsed line to ``rec``; return the session (header count - 1). Raises on a malformed line."""
    kind = obj["kind"]
    if kind == "step":
        step = _step_number(obj["step"])
        rec.steps[step] = {k: _num(obj.get(k)) for k in STEP_METRICS if obj.get(k) is not None}
        if obj.get("autocast"):
            rec.autocast[step] = _text(obj["autocast"], "autocast")
        else:
            rec.autocast.pop(step, None)
        if obj.get("float32_math"):
            rec.float32_math[step] = _text(obj["float32_math"], "float32_math")
        else:
            rec.float32_math.pop(step, None)
    elif kind == "modules":
        step = _step_number(obj["step"])
        try:
            raw = base64.b64decode(obj["stats"], validate=True)
        except (ValueError, TypeError):
            raise ValueError("'stats' is not base64") from None
        entries = layouts.get((session, obj["layout"]))
        if entries is None:
            rec.notes.append(f"{path}:{number}: module record of step {step} names unknown "
                             f"layout {clean(obj['layout'])}; skipped")
            return session
        if len(raw) != 8 * NSTATS * len(entries):
            rec.notes.append(f"{path}:{number}: module record of step {step} has "
                             f"{len(raw) // 8} numbers for {len(entries)} entries; skipped")
            return session
        rec.modules[step] = (entries, raw)
    elif kind == "layout":
        layouts[(session, obj["id"])] = _layout(obj)
    elif kind == "header":
        header = _header(obj)
        if str(header.get("format", "")).split("/")[0] != FORMAT.split("/")[0]:
            raise RecordError(f"{path}:{number}: not a probe recording (header format {header.get('format')!r}, "
                              f"expected {FORMAT!r})")
        session += 1
        rec.headers.append(header)
        if not rec.header:
            rec.header = header
        rec.end = None
    elif kind == "end":
        rec.end = clean(obj)
    return session


_MODULES_PREFIX = b'{"kind":"modules","step":'
_MODULES_HEAD = re.compile(rb'\{"kind":"modules","step":(\d+),"layout":(\d+),"stats":"\Z')


def _fast_modules(line: bytes) -> dict[str, Any] | None:
    """A ``modules`` line exactly as the probe writes it, without running the JSON parser over its stats.

    Returns ``None`` for anything else (then the line goes through ``json.loads``).
    """
    if not line.endswith(b'"}\n') and not line.endswith(b'"}'):
        return None  # torn by a crash: let the JSON parser say so
    start = line.find(b'"stats":"')
    end = line.rfind(b'"}')
    if start < 0 or end < start:
        return None
    head = _MODULES_HEAD.match(line, 0, start + 9)
    if head is None:
        return None
    return {"kind": "modules", "step": int(head.group(1)), "layout": int(head.group(2)),
            "stats": line[start + 9:end]}


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{clean(value)!r} is not a number")
    return float(value)
