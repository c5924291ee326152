"""When two numbers count as the same: exact, explicit rtol/atol, or dtype-aware defaults.

Usage::

    tol = Tolerance()                              # dtype-aware defaults
    rtol, atol = tol.resolve("bfloat16")           # (0.128, 8e-05)
    tol.close(2.30, 2.31, "bfloat16")              # True: rtol 1.6e-2 * 8
    Tolerance(exact=True).close(1.0, 1.0 + 1e-12)  # False

The defaults start from torch.testing's per-dtype tolerances (``torch.testing.assert_close``):
what one operation may differ by between two correct implementations. A recorded value comes
out of a chain of operations (a layer's statistics, a whole step's loss and gradient norm), and
rounding errors of a chain of n operations grow like sqrt(n), so the defaults are those
tolerances times :data:`CHAIN_FACTOR` (8: about 64 chained operations). On the examples' MNIST
network, a bfloat16-autocast run differs from a float32 run by up to 6% in its first two steps'
statistics (bfloat16's rtol 1.6e-2 times 8 is 0.128); a float32 layer with 1e-2 added to its
output differs by far more than float32's 1.3e-6 times 8. Pass ``--rtol``/``--atol`` to set
them yourself. A value is close when
``|a - b| <= atol + rtol * scale``, where the scale is ``max(|a|, |b|)`` (so the check is the
same both ways round). NaN is never close, not even to NaN; Inf is close only to the same Inf.
The dtype that decides is the loosest one involved: the dtypes of both tensors and the autocast
dtype of that step in either run, because a float32 result computed from bfloat16 inputs carries
bfloat16's error; likewise the narrower format a device computed float32 convolutions or matrix
products in that step (TF32 on recent NVIDIA GPUs, HF32 on Ascend; both on by default for
convolutions), which counts as float16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# torch.testing._comparison._DTYPE_PRECISIONS (torch 2.1 to 2.14 agree); a test checks this copy
# against torch's own, so reading a recording needs no torch import.
DTYPE_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}
CHAIN_FACTOR = 8.0
"""torch.testing's per-operation tolerances are multiplied by this for recorded values (see above)."""

DEFAULT_DTYPE = "float32"
"""Used when nothing says which dtype produced a value (metrics files, logs, integer tensors)."""

# Reduced-precision types that torch.testing has no entry for: as loose as their nearest relative.
_ALIASES = {"tfloat32": "float16", "hfloat32": "float16",  # float32's range, float16's mantissa (or 1 bit more)
            "float8_e4m3fn": "bfloat16", "float8_e5m2": "bfloat16", "float8_e4m3fnuz": "bfloat16",
            "float8_e5m2fnuz": "bfloat16", "half": "float16", "float": "float32", "double": "float64"}


def dtype_tolerance(dtype: str | None) -> tuple[float, float]:
    """torch.testing's ``(rtol, atol)`` for ``dtype`` (a torch dtype name, with or without ``torch.``)."""
    name = (dtype or DEFAULT_DTYPE).replace("torch.", "")
    name = _ALIASES.get(name, name)
    return DTYPE_TOLERANCES.get(name, DTYPE_TOLERANCES[DEFAULT_DTYPE])


def loosest(*dtypes: str | None) -> str:
    """The dtype with the largest default rtol among ``dtypes`` (ignoring ``None``)."""
    known = [d for d in dtypes if d]
    if not known:
        return DEFAULT_DTYPE
    return max(known, key=lambda d: dtype_tolerance(d))


@dataclass(frozen=True)
class Tolerance:
    """How close two runs must be.

    Attributes:
        rtol: relative tolerance; ``None`` takes the dtype's default.
        atol: absolute tolerance; ``None`` takes the dtype's default.
        exact: every number must be bit-for-bit equal (NaN still fails).
        dtype: the dtype to assume where a record names none (metrics files, logs).
    """

    rtol: float | None = None
    atol: float | None = None
    exact: bool = False
    dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"--{name} {value} must be a finite number >= 0.")
        if self.exact and (self.rtol is not None or self.atol is not None):
            raise ValueError("--exact allows no difference at all; drop --rtol/--atol or drop --exact.")

    def resolve(self, *dtypes: str | None) -> tuple[float, float]:
        """``(rtol, atol)`` for values produced in ``dtypes``."""
        if self.exact:
            return 0.0, 0.0
        base_rtol, base_atol = dtype_tolerance(loosest(*dtypes, self.dtype))
        return (self.rtol if self.rtol is not None else base_rtol * CHAIN_FACTOR,
                self.atol if self.atol is not None else base_atol * CHAIN_FACTOR)

    def describe(self) -> str:
        """One line for reports."""
        if self.exact:
            return "exact (bit-for-bit)"
        if self.rtol is not None and self.atol is not None:
            return f"rtol {self.rtol:g}, atol {self.atol:g}"
        parts = [f"{k} {getattr(self, k):g}" for k in ("rtol", "atol") if getattr(self, k) is not None]
        return f"dtype-aware defaults (torch.testing's per-dtype rtol/atol x {CHAIN_FACTOR:g}" + (
            ", with " + ", ".join(parts) if parts else "") + ")"

    def close(self, a: float, b: float, *dtypes: str | None) -> bool:
        """Whether ``a`` and ``b`` agree; NaN never does."""
        rtol, atol = self.resolve(*dtypes)
        return is_close(a, b, rtol, atol)


def is_close(a: float, b: float, rtol: float, atol: float, scale: float | None = None) -> bool:
    """``|a - b| <= atol + rtol * scale`` (scale ``max(|a|, |b|)`` by default); NaN is never close."""
    if a != a or b != b:
        return False
    if a == b:
        return True
    if math.isinf(a) or math.isinf(b):
        return False
    if scale is None:
        scale = max(abs(a), abs(b))
    return abs(a - b) <= atol + rtol * scale


def errors(a: float, b: float) -> tuple[float, float]:
    """Absolute and relative error of ``a`` against ``b`` (relative to ``max(|a|, |b|)``; NaN in, NaN out)."""
    if a != a or b != b:
        return math.nan, math.nan
    if a == b:
        return 0.0, 0.0
    diff = abs(a - b)
    if math.isinf(diff):
        return math.inf, math.inf
    scale = max(abs(a), abs(b))
    return diff, diff / scale if scale else math.inf
