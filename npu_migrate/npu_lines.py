"""torch_npu's warnings about where operators really ran, recognised in any rank's output (torch-free).

Usage::

    from npu_migrate import npu_lines

    npu_lines.COLLECTED.feed(rank, b"...Warning: CAUTION: The operator 'aten::isin.Tensor_Tensor_out' is "
                                   b"not currently supported on the NPU backend and will fall back ...\\n")
    npu_lines.COLLECTED.by_rank()     # {"0": {"cpu_fallback": {"aten::isin.Tensor_Tensor_out": 1}}}
    npu_lines.COLLECTED.summary()     # ["rank 0: 1 CPU fallback (aten::isin.Tensor_Tensor_out)"]

The launcher's line relay (:mod:`npu_migrate.launch.procs.output`) feeds every whole line it relays; the
summary goes to the console at the job's end and ``by_rank()`` into ``--error-file``. The texts are
torch_npu's own, as its wheels print them (``strings libtorch_npu.so`` of 2.14.0, and users' logs)::

    [W610 18:26:03.055 VariableFallbackKernel.cpp:250] Warning: CAUTION: The operator
      'aten::bitwise_left_shift.Tensor_out' is not currently supported on the NPU backend and will fall
      back to run on the CPU. This may have performance implications. (function npu_cpu_fallback)
    Warning: kernel [sinc] is not supported by NPU currently. Now this kernel is running on CPU.
    The operator 'aten::x' would execute its main computation on CPU through dispatcher backend
      fallback, but CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1.      (launch --strict-ops)
    Warning: kernel [ArgSort] can not support dtype int32 or int64 on AiCore, Now this kernel is running
      on AiCpu.If you are more concerned about high-performance execution,please cast dtype to float32.
    Device do not support double dtype now, dtype cast replace with float.
    [Cumsum] Dtype Double will be replaced with Float!

A line is looked at only when one fast search over the relayed bytes finds a key phrase, so the
relay's cost does not change for ordinary output.
"""

from __future__ import annotations

import enum
import re
import threading


class Kind(str, enum.Enum):
    """What a recognised line says happened."""

    CPU_FALLBACK = "cpu_fallback"
    FALLBACK_REFUSED = "fallback_refused"  # TORCH_NPU_FALLBACK_CPU_DISABLE=1 (launch --strict-ops)
    AICPU = "aicpu"
    DOUBLE_CAST = "double_cast"


_NAME = rb"[\w:.]+"
PATTERNS: tuple[tuple[Kind, re.Pattern[bytes]], ...] = (
    (Kind.FALLBACK_REFUSED, re.compile(
        rb"The operator '(?P<op>" + _NAME + rb")' would execute its main computation on CPU.*"
        rb"but CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1")),
    (Kind.CPU_FALLBACK, re.compile(
        rb"CAUTION: The operator '?(?P<op>" + _NAME + rb")'?(?: and " + _NAME + rb")? is "
        rb"(?:not currently|currently not) supported on the NPU backend")),
    (Kind.CPU_FALLBACK, re.compile(
        rb"(?:kernel \[(?P<op>" + _NAME + rb")\]|(?P<op2>" + _NAME + rb")) is not supported by NPU currently\. ?"
        rb"Now this kernel is running on CPU")),
    (Kind.AICPU, re.compile(
        rb"kernel \[(?P<op>" + _NAME + rb")\] can not support dtype .* on AiCore, ?Now this kernel is running on AiCpu")),
    (Kind.DOUBLE_CAST, re.compile(
        rb"(?:\[(?P<op>\w+)\] Dtype Double will be replaced with Float|"
        rb"Device do not support double dtype(?: of rtol and atol)? now, dtype cast re(?:place|palce) with float)")),
)
_ANY = re.compile(rb"CAUTION: The operator|supported by NPU currently|disabled by TORCH_NPU_FALLBACK_CPU_DISABLE|"
                  rb"running on AiCpu|Dtype Double will be replaced|support double dtype")


def recognise(line: bytes) -> tuple[Kind, str] | None:
    """``(kind, operator)`` for one of torch_npu's lines (operator ``""`` where the line names none)."""
    for kind, pattern in PATTERNS:
        match = pattern.search(line)
        if match:
            groups = match.groupdict()
            op = groups.get("op") or groups.get("op2") or b""
            return kind, op.decode("ascii", "replace")
    return None


class Collected:
    """Counts of recognised lines per rank, kind and operator (the relay's thread feeds, any thread reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, dict[Kind, dict[str, int]]] = {}

    def feed(self, rank: int, data: bytes) -> None:
        """Look at whole lines a rank wrote (cheap when none is torch_npu's)."""
        if _ANY.search(data) is None:
            return
        for line in data.splitlines():
            found = recognise(line)
            if found is None:
                continue
            kind, op = found
            with self._lock:
                per_op = self._counts.setdefault(rank, {}).setdefault(kind, {})
                per_op[op] = per_op.get(op, 0) + 1

    def by_rank(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{"0": {"cpu_fallback": {"aten::isin.Tensor_Tensor_out": 2}}}`` (JSON-ready)."""
        with self._lock:
            return {str(rank): {kind.value: dict(ops) for kind, ops in kinds.items()}
                    for rank, kinds in sorted(self._counts.items())}

    def summary(self) -> list[str]:
        """One line per rank that printed any, for the launcher's summary."""
        words = {Kind.CPU_FALLBACK: "CPU fallback(s)", Kind.FALLBACK_REFUSED: "fallback(s) refused by --strict-ops",
                 Kind.AICPU: "AiCPU kernel(s)", Kind.DOUBLE_CAST: "float64 cast(s)"}
        lines = []
        for rank, kinds in self.by_rank().items():
            parts = []
            for kind in Kind:
                ops = kinds.get(kind.value)
                if ops:
                    names = ", ".join(op for op in sorted(ops) if op) or "unnamed"
                    parts.append(f"{sum(ops.values())} {words[kind]} ({names})")
            lines.append(f"rank {rank}: torch_npu reported " + "; ".join(parts))
        return lines

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


COLLECTED = Collected()
"""This launcher's ranks' recognised lines (one launcher process per node)."""
