"""npu_migrate/port/torch_devices.py lists every torch call that takes a device, as torch itself says.

The port never imports torch, so the table of calls whose ``device`` it ports (NM011) is committed,
generated from the installed torch's metadata by :func:`collect`: npu_migrate.cuda_api's
enumeration of ``torch.*`` and ``torch.Tensor.*`` (aten operator schemas, signatures, docstring
signature lines), and the signatures (or docstring signature lines) of the public callables of the
submodules in :data:`SCANNED` and of ``torch.nn.Module``'s methods. The test fails, by name, when the
installed torch has a call that takes a device and the table lacks it. Regenerate with::

    python tests/port/test_torch_devices.py --write

Writing adds the installed torch's calls to those already listed (run it under each supported
torch, e.g. ``.venv-torch2.1/bin/python``), so one table serves them all.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "npu_migrate" / "port" / "torch_devices.py"
REGENERATE = "python tests/port/test_torch_devices.py --write"

# Submodules whose public callables are read by signature; torch and torch.Tensor come from cuda_api.
SCANNED = ("torch.nn", "torch.fft", "torch.special", "torch.linalg", "torch.signal.windows", "torch.sparse",
           "torch.nested", "torch.testing", "torch.distributed")
# Methods read from torch.nn.Module (model.to_empty(device=...)).
MODULE_CLASSES = ("torch.nn.Module",)
# Ported by other rules or not CUDA: .to(), .cuda() (NM001/NM011), pin_memory (a pinning target, not a
# placement), torch.GradScaler / record_stream (a device *type* and a stream), other vendors' moves.
_OTHER_RULE_OPS = frozenset({"to", "cuda", "pin_memory", "grad_scaler", "record_stream"})
_OTHER_METHODS = frozenset({"to", "cuda", "pin_memory", "xpu", "ipu", "mtia", "hpu", "cpu", "npu"})
_DOC_LINE = re.compile(r"^\s*(\w+)\((.*)\)")


def _first_positional(value: Any) -> Optional[str]:
    """The name of the first parameter that may be passed positionally (``self`` skipped), from the signature."""
    try:
        params = list(inspect.signature(value).parameters.values())
    except (TypeError, ValueError):
        return None
    params = [p for p in params if p.name != "self"]
    if params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return params[0].name
    return None


def _doc_parameters(value: Any, name: str) -> Optional[str]:
    """The parameter list of a docstring's signature line (``Stream(device, *, priority)``), if it names ``name``."""
    doc = getattr(value, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    match = _DOC_LINE.match(doc.lstrip("\n").splitlines()[0])
    return match.group(2) if match and match.group(1) == name else None


def _device_first_in_schemas(torch: Any, op: str) -> bool:
    """Whether an aten overload of ``op`` takes ``device`` as its first positional argument after ``self``."""
    for schema in torch._C._jit_get_all_schemas():
        if schema.name != f"aten::{op}":
            continue
        args = [a for a in schema.arguments if a.name != "self" and not a.kwarg_only]
        if args and args[0].name == "device":
            return True
    return False


def _attribute(owner: Any, name: str) -> Any:
    try:
        return getattr(owner, name, None)
    except Exception:  # noqa: BLE001 - a lazy attribute that fails to load is not a device API
        return None


def _device_parameter(value: Any) -> Optional[inspect.Parameter]:
    """``value``'s ``device`` parameter; a class that passes ``**kwargs`` on (nn.LSTM) has its base's."""
    params = inspect.signature(value).parameters
    if "device" in params or not inspect.isclass(value):
        return params.get("device")
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    for base in value.__mro__[1:]:
        try:
            param = inspect.signature(base).parameters.get("device")
        except (TypeError, ValueError):
            continue
        if param is not None:
            return param
    return None


def _scan(owner: Any, prefix: str) -> dict[str, bool]:
    """``{prefix + name: device may come first}`` for the public callables of ``owner`` with a ``device``."""
    found: dict[str, bool] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated aliases warn when read (torch.distributed.reduce_op)
        for name in dir(owner):
            if not name.startswith("_"):
                first = _takes_device(_attribute(owner, name), name)
                if first is not None:
                    found[prefix + name] = first
    return found


def _takes_device(value: Any, name: str) -> Optional[bool]:
    """``None`` if ``value`` takes no device ordinal, else whether the device may come first."""
    if inspect.ismodule(value) or not callable(value):
        return None
    if inspect.isclass(value) and issubclass(value, BaseException):
        return None
    try:
        param = _device_parameter(value)
    except (TypeError, ValueError):
        args = _doc_parameters(value, name)
        if args is None or not re.search(r"(^|[\s,(*])device\b", args):
            return None
        return args.split("*")[0].split(",")[0].split(":")[0].split("=")[0].strip() == "device"
    if param is None:
        return None
    annotation = param.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    if text == "str":
        return None  # a device *type* ("cuda"), never an ordinal
    return _first_positional(value) == "device"


def collect() -> tuple[dict[str, bool], dict[str, bool]]:
    """``(functions, methods)`` of the installed torch that take a device, each with "device may come first".

    Functions are qualified names (``torch.zeros``, ``torch.nn.Linear``); methods are names of
    ``torch.Tensor`` / ``torch.nn.Module`` methods (``new_zeros``, ``to_empty``). Imports torch.
    """
    import torch

    from npu_migrate import cuda_api

    functions: dict[str, bool] = {}
    methods: dict[str, bool] = {}
    for name, param in cuda_api.device_apis().items():
        row = cuda_api.classify_torch(name, param.type)
        if row is not None and (row.kind == "ignored" or row.op in _OTHER_RULE_OPS):
            continue
        owner_name, _, attr = name.rpartition(".")
        value = getattr(torch.Tensor if owner_name == "torch.Tensor" else torch, attr)
        doc_args = _doc_parameters(value, attr)
        first = param.positional and (
            _first_positional(value) == "device"
            or (doc_args is not None and doc_args.split("*")[0].split(",")[0].split("=")[0].strip() == "device")
            or _device_first_in_schemas(torch, attr)
        )
        if owner_name == "torch.Tensor":
            methods[attr] = methods.get(attr, False) or first
        else:
            functions[name] = first
    for module in SCANNED:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue  # torch.signal arrived in 2.1; a build without distributed
        functions.update(_scan(owner, module + "."))
    for cls in MODULE_CLASSES:
        module, _, name = cls.rpartition(".")
        for qualified, first in _scan(getattr(importlib.import_module(module), name), "").items():
            if qualified not in _OTHER_METHODS:
                methods[qualified] = methods.get(qualified, False) or first
    return functions, methods


def committed() -> tuple[dict[str, bool], dict[str, bool], tuple[str, ...]]:
    """The committed table, as ``collect()`` answers, and the torch versions it was generated from."""
    from npu_migrate.port import torch_devices as t

    functions = {n: n in t.DEVICE_FIRST_FUNCTIONS for n in t.DEVICE_FUNCTIONS}
    methods = {n: n in t.DEVICE_FIRST_METHODS for n in t.DEVICE_METHODS}
    return functions, methods, t.GENERATED_FROM


def _frozenset(name: str, comment: str, items: Iterable[str]) -> list[str]:
    return [f"# {comment}", f"{name}: frozenset[str] = frozenset({{", *(f'    "{i}",' for i in sorted(items)), "})"]


def render(functions: dict[str, bool], methods: dict[str, bool], versions: Iterable[str]) -> str:
    """The text of npu_migrate/port/torch_devices.py."""
    lines = [
        '"""Which torch calls take a device: the table NM011 of ``npu-migrate port`` reads (generated; do not edit).',
        "",
        "Usage::",
        "",
        "    from npu_migrate.port.torch_devices import DEVICE_FUNCTIONS, DEVICE_METHODS",
        "",
        '    "torch.zeros" in DEVICE_FUNCTIONS     # torch.zeros(..., device=local_rank) takes a device',
        '    "new_zeros" in DEVICE_METHODS         # x.new_zeros(..., device=local_rank) too',
        "",
        "Read from torch's own metadata (aten operator schemas, signatures and docstring signature lines of",
        "``torch``, ``torch.Tensor``, ``torch.nn.Module`` and the submodules tests/port/test_torch_devices.py",
        "scans), so the port itself never imports torch. Calls that other rules port (``.to``, ``.cuda``) and",
        "parameters that take a device *type* string (``torch.GradScaler``) are left out.",
        "",
        "Generated by tests/port/test_torch_devices.py, which fails when the installed torch has a call that",
        f"takes a device and is missing here; regenerate with ``{REGENERATE}`` (it adds",
        "the installed torch's calls to those listed, so one table serves every supported torch).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        f"GENERATED_FROM: tuple[str, ...] = {_tuple(_versions(versions))}",
        "",
    ]
    lines += _frozenset("DEVICE_FUNCTIONS", "Qualified names of functions and classes with a `device` parameter.",
                        functions)
    lines += [""] + _frozenset("DEVICE_FIRST_FUNCTIONS", "Those whose first positional parameter is the device "
                               "(torch.set_default_device(0)).", [n for n, f in functions.items() if f])
    lines += [""] + _frozenset("DEVICE_METHODS", "torch.Tensor and torch.nn.Module methods with a `device` "
                               "parameter, by name.", methods)
    lines += [""] + _frozenset("DEVICE_FIRST_METHODS", "Those whose first positional parameter (after self) "
                               "is the device.", [n for n, f in methods.items() if f])
    return "\n".join(lines) + "\n"


def _tuple(items: list[str]) -> str:
    return "(" + ", ".join(f'"{i}"' for i in items) + ("," if len(items) == 1 else "") + ")"


def _versions(versions: Iterable[str]) -> list[str]:
    """Distinct versions, oldest first."""
    return sorted(set(versions), key=lambda v: tuple(int(p) if p.isdigit() else 0 for p in v.split(".")))


def _merge(old: dict[str, bool], new: dict[str, bool]) -> dict[str, bool]:
    return {n: old.get(n, False) or new.get(n, False) for n in {*old, *new}}


def write() -> str:
    """Add the installed torch's calls to the committed table; return the torch version read."""
    import torch

    functions, methods = collect()
    if TABLE.exists():
        old_functions, old_methods, versions = committed()
        functions, methods = _merge(old_functions, functions), _merge(old_methods, methods)
    else:
        versions = ()
    version = torch.__version__.split("+")[0]
    TABLE.write_text(render(functions, methods, (*versions, version)))
    return version


# --------------------------------------------------------------------------- the checks


def _missing(have: dict[str, bool], want: dict[str, bool], kind: str) -> list[str]:
    problems = [f"{kind} {n}" for n in sorted(want) if n not in have]
    problems += [f"{kind} {n}: the device may come first" for n, first in sorted(want.items())
                 if first and n in have and not have[n]]
    return problems


def test_the_table_has_every_call_of_this_torch_that_takes_a_device() -> None:
    import torch

    functions, methods = collect()
    for known in ("torch.zeros", "torch.ones", "torch.arange", "torch.tensor", "torch.Generator", "torch.randn",
                  "torch.empty_like", "torch.nn.Linear", "torch.fft.fftfreq"):
        assert known in functions, known
    assert {"new_zeros", "new_tensor", "to_empty"} <= set(methods)
    assert not {"to", "cuda", "pin_memory"} & set(methods)
    assert "torch.GradScaler" not in functions  # its device is a type string
    have_functions, have_methods, versions = committed()
    problems = _missing(have_functions, functions, "function") + _missing(have_methods, methods, "method")
    assert not problems, (f"{TABLE.relative_to(ROOT)} lacks what torch {torch.__version__} takes a device in "
                          f"(generated from {', '.join(versions)}); run {REGENERATE}: {problems}")


SEEN_FIRST_ELSEWHERE = {"torch.Generator"}
"""Calls whose device comes first in another supported torch's signature than this one's."""


def test_the_table_says_where_the_device_may_come_first() -> None:
    """For the calls both know, the table and this torch agree on a positional device."""
    functions, methods = collect()
    have_functions, have_methods, _ = committed()
    for have, want in ((have_functions, functions), (have_methods, methods)):
        # torch.Generator's device is positional on torch 2.1 (keyword-only in later signatures, though
        # they accept it positionally at run time): the table holds every supported torch's calls.
        wrong = [n for n, first in have.items() if first and n in want and not want[n] and n not in SEEN_FIRST_ELSEWHERE]
        assert not wrong, f"the table lets these take the device first, torch does not: {wrong}"
    assert have_functions["torch.set_default_device"] and not have_functions["torch.zeros"]


def test_the_table_is_what_render_writes() -> None:
    functions, methods, versions = committed()
    assert TABLE.read_text() == render(functions, methods, versions), f"edited by hand: run {REGENERATE}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}")
    print(f"{TABLE.relative_to(ROOT)}: written from torch {write()}")
