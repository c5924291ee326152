"""The port rule table: every API name the codemod knows lives here, one row per rule code.

Usage::

    from npu_migrate.port.rules import RULES, rule_by_code

    for rule in RULES:
        print(rule.code, rule.summary, "->", rule.fix)

A :class:`Rule` is a code (``NM001``), the libcst node types it looks at, a matcher that returns a
:class:`Hit` (a replacement node, or a finding when the code needs a human), a one-line summary
and a suggested fix. :mod:`npu_migrate.port.transformer` walks the tree and calls the matchers; it
holds no API names of its own. Replacements are written through :data:`TARGETS`, which spells
each device-neutral operation once per output style (``npu_migrate`` or plain ``torch``).

``NM0xx`` rules rewrite; ``NM1xx`` rules only report.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal, Optional, Sequence

import libcst as cst

if TYPE_CHECKING:  # pragma: no cover
    from npu_migrate.port.transformer import Context

Style = Literal["npu_migrate", "torch"]
STYLES: tuple[str, ...] = ("npu_migrate", "torch")

# --------------------------------------------------------------------------- output targets


@dataclass(frozen=True)
class Target:
    """One device-neutral operation, spelled once per output style.

    Templates are Python expressions. ``ARGS`` (or ``**ARGS`` after a keyword) stands for the
    call's original arguments, kept as written, and ``ARG0`` for the first argument's value. ``None`` means the style has no
    equivalent, so the rule reports the site instead of rewriting it.

    Attributes:
        npu_migrate: template for ``--style npu_migrate`` (``import npu_migrate as nm``).
        torch: template for ``--style torch`` (torch >= 2.6, no npu_migrate).
        helpers: names from :data:`TORCH_HELPERS` the torch template calls.
        torch_missing: why the torch style has no template, for the finding.
    """

    npu_migrate: Optional[str]
    torch: Optional[str]
    helpers: tuple[str, ...] = ()
    torch_missing: str = ""


_DEV = ("_accelerator_device",)
_MOD = ("_accelerator_device", "_accelerator_module")

TARGETS: dict[str, Target] = {
    "get_device": Target("nm.get_device(ARGS)", "_accelerator_device(ARGS)", _DEV),
    "device_str": Target("str(nm.get_device(ARGS))", "str(_accelerator_device(ARGS))", _DEV),
    "device_type": Target("nm.device_type()", "_accelerator_device().type", _DEV),
    "accelerator_available": Target("nm.accelerator_available()", "torch.accelerator.is_available()"),
    "device_count": Target("nm.device_count()", "_accelerator_module().device_count()", _MOD),
    "set_device": Target("nm.set_device(ARGS)", "_accelerator_module().set_device(ARGS)", _MOD),
    "current_device_index": Target(
        "nm.current_device_index()",
        "torch.accelerator.current_device_index() if torch.accelerator.is_available() else 0",
    ),
    "synchronize": Target("nm.synchronize()", "_accelerator_module().synchronize()", _MOD),
    # torch.manual_seed seeds the CPU and every accelerator; torch has no "device generators only".
    "manual_seed_all": Target("nm.manual_seed_all(ARGS)", "torch.manual_seed(ARGS)"),
    "memory_allocated": Target("nm.memory_allocated(ARGS)", "torch.accelerator.memory_allocated(ARGS)"),
    "max_memory_allocated": Target(
        "nm.max_memory_allocated(ARGS)", "torch.accelerator.max_memory_allocated(ARGS)"
    ),
    "memory_reserved": Target("nm.memory_reserved(ARGS)", "torch.accelerator.memory_reserved(ARGS)"),
    "max_memory_reserved": Target(
        "nm.max_memory_reserved(ARGS)", "torch.accelerator.max_memory_reserved(ARGS)"
    ),
    "reset_peak_memory_stats": Target(
        "nm.reset_peak_memory_stats(ARGS)", "torch.accelerator.reset_peak_memory_stats(ARGS)"
    ),
    "memory_stats": Target("nm.memory_stats(ARGS)", "torch.accelerator.memory_stats(ARGS)"),
    "empty_cache": Target("nm.empty_cache()", "torch.accelerator.empty_cache()"),
    "Event": Target(
        "nm.Event(ARGS)", None,
        torch_missing="torch.cpu.Event takes no arguments and cannot time, so plain torch has no "
        "CPU fallback for timing events",
    ),
    "Stream": Target("nm.Stream(ARGS)", "_accelerator_module().Stream(ARGS)", _MOD),
    "stream": Target("nm.stream(ARGS)", "_accelerator_module().stream(ARGS)", _MOD),
    "current_stream": Target("nm.current_stream(ARGS)", "_accelerator_module().current_stream(ARGS)", _MOD),
    "device_name": Target(
        "nm.device_name(ARGS)", None,
        torch_missing="torch.accelerator has no device name and torch.cpu has no get_device_name",
    ),
    "autocast": Target(
        "torch.amp.autocast(device_type=nm.device_type(), **ARGS)",
        "torch.amp.autocast(device_type=_accelerator_device().type, **ARGS)", _DEV,
    ),
    "grad_scaler": Target("nm.grad_scaler(ARGS)", "torch.amp.GradScaler(_accelerator_device().type, ARGS)", _DEV),
    "default_backend": Target(
        "nm.default_backend()", "torch.distributed.get_default_backend_for_device(_accelerator_device())", _DEV
    ),
    "device_ids": Target("nm.device_ids(ARG0)", "[ARG0] if torch.accelerator.is_available() else None"),
    "output_device": Target("nm.output_device(ARG0)", "ARG0 if torch.accelerator.is_available() else None"),
    "visible_devices_env": Target(
        "nm.visible_devices_env()", None,
        torch_missing="torch has no API for the variable that masks devices",
    ),
}

# Functions `--style torch` inserts once per module, after the imports, when a rewrite uses them.
TORCH_HELPERS: dict[str, str] = {
    "_accelerator_device": '''\
def _accelerator_device(index=None):
    """This process's accelerator (torch.accelerator), or the CPU where there is none."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return torch.device("cpu") if accelerator is None else torch.device(accelerator.type, index)
''',
    "_accelerator_module": '''\
def _accelerator_module():
    """The torch module of the accelerator in use (torch.npu, ...), or torch.cpu where there is none."""
    return torch.get_device_module(_accelerator_device())
''',
}

NM_IMPORT = "import npu_migrate as nm"
NM_ALIAS = "nm"
TORCH_IMPORT = "import torch"

# --------------------------------------------------------------------------- rule rows


@dataclass(frozen=True)
class Hit:
    """What a matcher found at one node.

    Attributes:
        replacement: the node to put in place of the matched one; ``None`` reports only.
        message: one line saying what was changed or why it needs a human.
        fix: the suggested fix for a finding (defaults to the rule's).
    """

    replacement: Optional[cst.CSTNode] = None
    message: str = ""
    fix: str = ""


Matcher = Callable[[cst.CSTNode, "Context"], Optional[Hit]]


@dataclass(frozen=True)
class Rule:
    """One row of the table.

    Attributes:
        code: ``NMxxx``; ``NM0xx`` rewrite, ``NM1xx`` report.
        name: a short slug.
        summary: one line: what the rule rewrites or reports.
        fix: the suggested fix (for a rewrite: what it writes instead).
        nodes: libcst node classes the matcher is called with (after their children were ported).
        match: the matcher.
        triggers: substrings of which a file must contain one for the rule to fire; a file that
            contains none of any enabled rule's is not parsed at all.
    """

    code: str
    name: str
    summary: str
    fix: str
    nodes: tuple[type, ...]
    match: Matcher
    triggers: tuple[str, ...]
    rewrites: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rewrites", self.code.startswith("NM0"))


# --------------------------------------------------------------------------- matcher helpers

_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")
_CUDA_FMT_RE = re.compile(r"^cuda:(%d|%s|%i|\{\}|\{0\})$")
_DEVICE_NAME_RE = re.compile(r"(^|_)(device|dev)($|_)", re.I)
_BACKEND_NAME_RE = re.compile(r"backend", re.I)
# Names that hold an integer device index in real code: rank, local_rank, gpu, gpu_id, args.gpu...
_INDEX_NAME_RE = re.compile(r"^(local_|global_)?(rank|gpu)(_?(id|idx|index|num))?$|^gpu\d*$", re.I)


def string_value(node: cst.CSTNode) -> Optional[str]:
    """The value of a plain string literal, or ``None`` for anything else (bytes, f-strings...)."""
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - malformed escapes: not a literal we understand
            return None
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_value(node.left), string_value(node.right)
        return None if left is None or right is None else left + right
    return None


def _int_node(text: str) -> cst.Integer:
    return cst.Integer(text)


def cuda_spec(node: cst.BaseExpression) -> Optional[tuple[Optional[cst.BaseExpression]]]:
    """Parse a CUDA device written as a string.

    Returns ``(index,)`` for ``"cuda"`` (index ``None``), ``"cuda:1"``, ``f"cuda:{i}"``,
    ``"cuda:%d" % i``, ``"cuda:{}".format(i)`` and ``"cuda:" + str(i)``; ``None`` otherwise.
    """
    value = string_value(node)
    if value is not None:
        m = _CUDA_RE.match(value)
        if m is None:
            return None
        return (None if m.group(1) is None else _int_node(m.group(1)),)
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        if (
            len(parts) == 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
            and parts[1].conversion is None
            and parts[1].format_spec is None
        ):
            return (parts[1].expression,)
        return None
    if isinstance(node, cst.BinaryOperation):
        left = string_value(node.left)
        if isinstance(node.operator, cst.Modulo) and left is not None and _CUDA_FMT_RE.match(left):
            right = node.right
            if isinstance(right, cst.Tuple) and len(right.elements) == 1:
                right = right.elements[0].value
            return (right,)
        if isinstance(node.operator, cst.Add) and left == "cuda:":
            right = node.right
            if isinstance(right, cst.Call) and isinstance(right.func, cst.Name) and right.func.value == "str" \
                    and len(right.args) == 1:
                right = right.args[0].value
            return (right,)
        return None
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "format"
        and len(node.args) == 1
        and node.args[0].keyword is None
        and node.args[0].star == ""
    ):
        fmt = string_value(node.func.value)
        if fmt is not None and _CUDA_FMT_RE.match(fmt):
            return (node.args[0].value,)
    return None


def _arg(value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value)


def _index_args(index: Optional[cst.BaseExpression]) -> list[cst.Arg]:
    return [] if index is None else [_arg(index)]


def _availability_test(node: cst.BaseExpression, ctx: Context) -> bool:
    """True for ``torch.cuda.is_available()`` or what this tool already wrote for it."""
    return isinstance(node, cst.Call) and not node.args and (
        ctx.qualname(node.func) == "torch.cuda.is_available" or ctx.is_emitted(node, "accelerator_available")
    )


def _device_value(node: cst.BaseExpression, ctx: Context, as_str: bool) -> Optional[cst.BaseExpression]:
    """The port of a CUDA device string in a device position, or ``None`` if it is not one.

    ``as_str`` keeps the value a ``str`` (for variables and argparse defaults that later code may
    format); otherwise a ``torch.device`` is written. ``"cuda" if <available> else "cpu"`` is the
    device itself; with another condition only the ``"cuda"`` branch changes.
    """
    if isinstance(node, cst.IfExp):
        body_spec, else_value = cuda_spec(node.body), string_value(node.orelse)
        if body_spec is not None and else_value == "cpu" and _availability_test(node.test, ctx):
            index = body_spec[0]
            if as_str:
                return ctx.emit("device_type") if index is None else ctx.emit("device_str", _index_args(index))
            return ctx.emit("get_device", _index_args(index))
        new_body = _device_value(node.body, ctx, as_str=True) if body_spec is not None else None
        if new_body is not None:
            return node.with_changes(body=new_body)
        return None
    spec = cuda_spec(node)
    if spec is None:
        return None
    index = spec[0]
    if as_str:
        return ctx.emit("device_type") if index is None else ctx.emit("device_str", _index_args(index))
    return ctx.emit("get_device", _index_args(index))


def _keyword(call: cst.Call, name: str) -> Optional[int]:
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == name:
            return i
    return None


def _positional(call: cst.Call) -> list[int]:
    return [i for i, a in enumerate(call.args) if a.keyword is None and a.star == ""]


def _replace_arg_value(call: cst.Call, index: int, value: cst.BaseExpression) -> cst.Call:
    args = list(call.args)
    args[index] = args[index].with_changes(value=value)
    return call.with_changes(args=args)


def _last_name(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def _snippet(node: cst.CSTNode) -> str:
    return " ".join(cst.Module(body=[]).code_for_node(node).split())


def _option_strings(call: cst.Call) -> list[str]:
    return [v for a in call.args if a.keyword is None and (v := string_value(a.value)) is not None]


def _is_add_argument(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"


def _to_keywords(call: cst.Call, names: Sequence[str]) -> Optional[list[cst.Arg]]:
    """The call's arguments with positional ones named after ``names``; ``None`` if it has *args."""
    out = []
    pos = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if pos >= len(names):
                return None
            arg = arg.with_changes(
                keyword=cst.Name(names[pos]),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            )
            pos += 1
        out.append(arg)
    return out


# --------------------------------------------------------------------------- NM001 .cuda()


def _match_cuda_method(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Call)
    func = node.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "cuda"):
        return None
    if ctx.qualname(func.value) in ("torch", "torch.cuda"):
        return None
    index: Optional[cst.BaseExpression] = None
    rest = []
    for arg in node.args:
        if arg.star:
            return None
        if arg.keyword is None or arg.keyword.value == "device":
            if index is not None:
                return None
            index = arg.value
        elif arg.keyword.value in ("non_blocking", "memory_format"):
            rest.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        else:
            return None
    if isinstance(index, cst.Name) and index.value == "None":
        index = None
    device = ctx.emit("get_device", _index_args(index))
    new = node.with_changes(
        func=func.with_changes(attr=cst.Name("to")),
        args=[_arg(device), *rest],
    )
    return Hit(new)


# --------------------------------------------------------------------------- NM002 torch.device


def _match_torch_device(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Call)
    if ctx.qualname(node.func) != "torch.device" or not node.args:
        return None
    pos = _positional(node)
    type_i = pos[0] if pos else _keyword(node, "type")
    if type_i is None:
        return None
    index_i = pos[1] if len(pos) > 1 else _keyword(node, "index")
    if len(node.args) - (index_i is not None) != 1:
        return None
    value = node.args[type_i].value
    if index_i is not None:
        if string_value(value) != "cuda":
            return None
        return Hit(ctx.emit("get_device", [_arg(node.args[index_i].value)]))
    new = _device_value(value, ctx, as_str=False)
    if new is None:
        return None
    if isinstance(value, cst.IfExp) and isinstance(new, cst.IfExp):
        return Hit(_replace_arg_value(node, type_i, new))  # only the "cuda" branch changed
    return Hit(new)


# --------------------------------------------------------------------------- NM003 "cuda" strings

# Calls whose first positional argument is a device type string.
_DEVICE_TYPE_FIRST_ARG = ("torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.get_device_module")


def _match_device_string_call(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Call)
    new = node
    func = node.func
    pos = _positional(node)
    # x.to("cuda"), x.to("cuda:1"), x.to(f"cuda:{rank}")
    if isinstance(func, cst.Attribute) and func.attr.value == "to" and pos:
        value = _device_value(node.args[pos[0]].value, ctx, as_str=False)
        if value is not None:
            new = _replace_arg_value(new, pos[0], value)
    qual = ctx.qualname(func)
    if qual in _DEVICE_TYPE_FIRST_ARG and pos and string_value(node.args[pos[0]].value) == "cuda":
        new = _replace_arg_value(new, pos[0], ctx.emit("device_type"))
    for i, arg in enumerate(node.args):
        if arg.keyword is None:
            continue
        name = arg.keyword.value
        if name == "device":
            value = _device_value(arg.value, ctx, as_str=False)
        elif name == "device_type" and string_value(arg.value) == "cuda":
            value = ctx.emit("device_type")
        elif name == "default" and _is_add_argument(node) and any(
            _DEVICE_NAME_RE.search(o.lstrip("-").replace("-", "_")) for o in _option_strings(node)
        ):
            value = _device_value(arg.value, ctx, as_str=True)
        else:
            value = None
        if value is not None:
            new = _replace_arg_value(new, i, value)
    return Hit(new) if new is not node else None


def _assign_target_names(node: cst.CSTNode) -> list[str]:
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, cst.AnnAssign):
        targets = [node.target]
    else:
        return []
    return [n for t in targets if (n := _last_name(t)) is not None]


def _match_device_string_assign(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, (cst.Assign, cst.AnnAssign))
    if node.value is None or not any(_DEVICE_NAME_RE.search(n) for n in _assign_target_names(node)):
        return None
    value = _device_value(node.value, ctx, as_str=True)
    return Hit(node.with_changes(value=value)) if value is not None else None


def _match_device_string(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if isinstance(node, cst.Call):
        return _match_device_string_call(node, ctx)
    return _match_device_string_assign(node, ctx)


# --------------------------------------------------------------------------- NM004 torch.cuda.*

CUDA_CALLS: dict[str, str] = {
    "torch.cuda.is_available": "accelerator_available",
    "torch.cuda.device_count": "device_count",
    "torch.cuda.set_device": "set_device",
    "torch.cuda.current_device": "current_device_index",
    "torch.cuda.synchronize": "synchronize",
    "torch.cuda.manual_seed": "manual_seed_all",
    "torch.cuda.manual_seed_all": "manual_seed_all",
    "torch.cuda.memory_allocated": "memory_allocated",
    "torch.cuda.max_memory_allocated": "max_memory_allocated",
    "torch.cuda.memory_reserved": "memory_reserved",
    "torch.cuda.max_memory_reserved": "max_memory_reserved",
    "torch.cuda.memory_cached": "memory_reserved",
    "torch.cuda.max_memory_cached": "max_memory_reserved",
    "torch.cuda.reset_peak_memory_stats": "reset_peak_memory_stats",
    "torch.cuda.memory_stats": "memory_stats",
    "torch.cuda.empty_cache": "empty_cache",
    "torch.cuda.Event": "Event",
    "torch.cuda.Stream": "Stream",
    "torch.cuda.stream": "stream",
    "torch.cuda.current_stream": "current_stream",
    "torch.cuda.get_device_name": "device_name",
}

# Targets whose npu_migrate function takes no arguments although torch.cuda's takes an optional
# device: the argument is dropped only when it is the current device anyway.
_NO_ARGS = {"accelerator_available", "device_count", "current_device_index", "synchronize", "empty_cache"}


def _match_cuda_api(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if isinstance(node, cst.ImportFrom):
        return ctx.drop_rewritten_imports(node, CUDA_CALLS)
    assert isinstance(node, cst.Call)
    qual = ctx.qualname(node.func)
    op = CUDA_CALLS.get(qual or "")
    if op is None:
        return None
    args = list(node.args)
    message = ""
    if op in _NO_ARGS and args:
        if op == "synchronize" and len(args) == 1:
            message = "the device argument of synchronize() was dropped: nm.synchronize() waits for the current device"
            args = []
        else:
            return Hit(None, f"{qual}() with arguments has no device-neutral equivalent here",
                       f"call {TARGETS[op].npu_migrate} without arguments on the current device")
    if op == "memory_stats":
        message = "nm.memory_stats() returns only allocated/max_allocated/reserved/max_reserved"
    ctx.count_alias_rewrite(node.func)
    return Hit(ctx.emit(op, args, keep_call=node if len(args) == len(node.args) else None), message)


# --------------------------------------------------------------------------- NM005 amp

_AUTOCAST_PARAMS = ("enabled", "dtype", "cache_enabled")
_GRAD_SCALER_PARAMS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
AMP_CALLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch.cuda.amp.autocast": ("autocast", _AUTOCAST_PARAMS),
    "torch.cuda.amp.GradScaler": ("grad_scaler", _GRAD_SCALER_PARAMS),
    "torch.cuda.amp.grad_scaler.GradScaler": ("grad_scaler", _GRAD_SCALER_PARAMS),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", _AUTOCAST_PARAMS),
}


def _match_amp(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if isinstance(node, cst.ImportFrom):
        return ctx.drop_rewritten_imports(node, AMP_CALLS)
    assert isinstance(node, cst.Call)
    qual = ctx.qualname(node.func)
    if qual not in AMP_CALLS:
        return None
    op, params = AMP_CALLS[qual]
    args = _to_keywords(node, params)
    if args is None:
        return Hit(None, f"{qual}(*args) cannot be rewritten", "pass the arguments by keyword")
    ctx.count_alias_rewrite(node.func)
    return Hit(ctx.emit(op, args))


# --------------------------------------------------------------------------- NM006 nccl

def _backend_value(node: cst.BaseExpression, ctx: Context) -> Optional[cst.BaseExpression]:
    if string_value(node) == "nccl":
        return ctx.emit("default_backend")
    if isinstance(node, cst.IfExp) and string_value(node.body) == "nccl":
        if string_value(node.orelse) == "gloo" and _availability_test(node.test, ctx):
            return ctx.emit("default_backend")
        return node.with_changes(body=ctx.emit("default_backend"))
    return None


def _match_nccl(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if isinstance(node, (cst.Assign, cst.AnnAssign)):
        if node.value is None or not any(_BACKEND_NAME_RE.search(n) for n in _assign_target_names(node)):
            return None
        value = _backend_value(node.value, ctx)
        return Hit(node.with_changes(value=value)) if value is not None else None
    assert isinstance(node, cst.Call)
    new = node
    name = _last_name(node.func)
    pos = _positional(node)
    if name == "init_process_group" and pos:
        value = _backend_value(node.args[pos[0]].value, ctx)
        if value is not None:
            new = _replace_arg_value(new, pos[0], value)
    for i, arg in enumerate(node.args):
        if arg.keyword is None:
            continue
        kw = arg.keyword.value
        if kw in ("backend", "dist_backend") or (kw == "default" and _is_add_argument(node)):
            value = _backend_value(arg.value, ctx)
            if value is not None:
                new = _replace_arg_value(new, i, value)
    return Hit(new) if new is not node else None


# --------------------------------------------------------------------------- NM007 DDP


def _match_ddp(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Call)
    qual = ctx.qualname(node.func) or ""
    if not (qual.endswith("DistributedDataParallel") or qual == "DDP"):
        return None
    new = node
    pos = _positional(node)
    slots = {"device_ids": _keyword(node, "device_ids"), "output_device": _keyword(node, "output_device")}
    if slots["device_ids"] is None and len(pos) > 1:
        slots["device_ids"] = pos[1]
    if slots["output_device"] is None and len(pos) > 2:
        slots["output_device"] = pos[2]
    i = slots["device_ids"]
    if i is not None:
        value = node.args[i].value
        if isinstance(value, (cst.List, cst.Tuple)) and len(value.elements) == 1 \
                and isinstance(value.elements[0], cst.Element):
            new = _replace_arg_value(new, i, ctx.emit("device_ids", [_arg(value.elements[0].value)]))
        elif isinstance(value, (cst.List, cst.Tuple)) and len(value.elements) > 1:
            return Hit(None, "DDP over several devices per process is not portable",
                       "use one process per device: device_ids=nm.device_ids(local_rank)")
    i = slots["output_device"]
    if i is not None:
        value = node.args[i].value
        if not (isinstance(value, cst.Name) and value.value == "None") and not ctx.is_emitted(value, "output_device"):
            if isinstance(value, (cst.Name, cst.Attribute, cst.Integer, cst.Subscript)):
                new = _replace_arg_value(new, i, ctx.emit("output_device", [_arg(value)]))
    return Hit(new) if new is not node else None


# --------------------------------------------------------------------------- NM008 map_location


def _map_location_value(value: cst.BaseExpression, ctx: Context) -> tuple[Optional[cst.BaseExpression], str]:
    if isinstance(value, cst.Dict):
        elements = []
        changed = False
        for el in value.elements:
            if isinstance(el, cst.DictElement):
                new = _device_value(el.value, ctx, as_str=True)
                if new is not None:
                    el = el.with_changes(value=new)
                    changed = True
            elements.append(el)
        return (value.with_changes(elements=elements) if changed else None), ""
    if isinstance(value, cst.Lambda):
        params = value.params.params
        body = value.body
        if params and isinstance(body, cst.Call) and isinstance(body.func, cst.Attribute) \
                and isinstance(body.func.value, cst.Name) and body.func.value.value == params[0].name.value:
            attr = body.func.attr.value
            if attr == "cuda" and len(body.args) <= 1 and all(a.keyword is None for a in body.args):
                return ctx.emit("get_device", [_arg(a.value) for a in body.args]), ""
            # NM001 already turned `storage.cuda(i)` into `storage.to(<device>)`
            if attr == "to" and len(body.args) == 1 and ctx.is_emitted(body.args[0].value, "get_device"):
                return body.args[0].value, ""
        if "cuda" in _snippet(value):
            return None, "a map_location function that mentions cuda cannot be rewritten safely"
        return None, ""
    return _device_value(value, ctx, as_str=False), ""


def _match_map_location(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Call)
    i = _keyword(node, "map_location")
    if i is None and ctx.qualname(node.func) == "torch.load":
        pos = _positional(node)
        i = pos[1] if len(pos) > 1 else None
    if i is None:
        return None
    value, problem = _map_location_value(node.args[i].value, ctx)
    if problem:
        return Hit(None, problem, "pass map_location=nm.get_device() (or a dict of str(nm.get_device(i)) values)")
    return Hit(_replace_arg_value(node, i, value)) if value is not None else None


# --------------------------------------------------------------------------- NM009 is_cuda

# Parents under which `a.device.type == t` needs no parentheses.
_NO_PARENS = (cst.If, cst.While, cst.Assert, cst.Assign, cst.AnnAssign, cst.Return, cst.BooleanOperation,
              cst.Arg, cst.Element, cst.IfExp, cst.Lambda, cst.Expr, cst.DictElement)


def _match_is_cuda(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Attribute)
    if node.attr.value != "is_cuda" or ctx.qualname(node.value) in ("torch", "torch.cuda"):
        return None
    left = cst.Attribute(value=cst.Attribute(value=node.value, attr=cst.Name("device")), attr=cst.Name("type"))
    comparison = cst.Comparison(left=left, comparisons=[cst.ComparisonTarget(cst.Equal(), ctx.emit("device_type"))])
    parent = ctx.parent
    if not (isinstance(parent, _NO_PARENS) or (isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not))):
        comparison = comparison.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return Hit(comparison.with_changes(lpar=list(node.lpar) or comparison.lpar, rpar=list(node.rpar) or comparison.rpar))


# --------------------------------------------------------------------------- NM010 CUDA_VISIBLE_DEVICES

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_ENVIRON_CALLS = ("os.environ.get", "os.environ.setdefault", "os.environ.pop", "os.getenv", "os.putenv",
                  "os.unsetenv", "os.environ.__contains__")


def _match_visible_devices(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if isinstance(node, cst.Subscript):
        if ctx.qualname(node.value) != "os.environ" or len(node.slice) != 1:
            return None
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and string_value(index.value) == VISIBLE_DEVICES:
            return Hit(node.with_changes(slice=[node.slice[0].with_changes(slice=index.with_changes(
                value=ctx.emit("visible_devices_env")))]))
        return None
    if isinstance(node, cst.Comparison):
        if string_value(node.left) == VISIBLE_DEVICES and len(node.comparisons) == 1 \
                and isinstance(node.comparisons[0].operator, (cst.In, cst.NotIn)) \
                and ctx.qualname(node.comparisons[0].comparator) == "os.environ":
            return Hit(node.with_changes(left=ctx.emit("visible_devices_env")))
        return None
    assert isinstance(node, cst.Call)
    if ctx.qualname(node.func) in _ENVIRON_CALLS and node.args and string_value(node.args[0].value) == VISIBLE_DEVICES:
        return Hit(_replace_arg_value(node, 0, ctx.emit("visible_devices_env")))
    return None


# --------------------------------------------------------------------------- NM011 .to(rank)


def _match_index_to(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Call)
    func = node.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "to") or len(node.args) != 1:
        return None
    arg = node.args[0]
    if arg.keyword is not None or arg.star:
        return None
    value = arg.value
    name = _last_name(value)
    is_index = isinstance(value, cst.Integer) or (
        name is not None and _INDEX_NAME_RE.match(name) is not None and ctx.qualname(value) == _dotted(value)
    )
    if not is_index:
        return None
    return Hit(_replace_arg_value(node, 0, ctx.emit("get_device", [_arg(value)])))


def _dotted(node: cst.BaseExpression) -> Optional[str]:
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


# --------------------------------------------------------------------------- report-only rules


def _reference_matcher(prefixes: tuple[str, ...], message: str, exact: bool = True) -> Matcher:
    """Report imports from ``prefixes`` and names that resolve to one of them."""

    def match(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            for module in ctx.imported_names(node):
                if any(module == p or module.startswith(p + ".") for p in prefixes):
                    return Hit(None, message.format(name=module))
            return None
        if ctx.in_import or (isinstance(node, cst.Name) and node.value not in ctx.aliases):
            return None  # a bare name counts only where an import bound it
        qual = ctx.qualname(node)
        if qual is not None and qual in prefixes:
            return Hit(None, message.format(name=qual))
        return None

    return match


def _match_cu_source(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if isinstance(node, cst.SimpleString):
        value = string_value(node)
        if value is not None and value.endswith((".cu", ".cuh")) and "\n" not in value:
            return Hit(None, f"CUDA source file {value!r}: a CUDA kernel has to be ported to Ascend C by hand")
        return None
    return _cpp_extension(node, ctx)


_cpp_extension = _reference_matcher(
    ("torch.utils.cpp_extension",),
    "{name}: a CUDA/C++ extension must be rebuilt for Ascend (torch_npu's op-plugin)",
)


def _match_float64(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "double" and not node.args:
            return Hit(None, ".double() makes float64 tensors, which Ascend NPUs do not compute in")
        return None
    if ctx.in_import:
        return None
    qual = ctx.qualname(node)
    if qual in ("torch.float64", "torch.double"):
        return Hit(None, f"{qual} is not supported on Ascend NPUs")
    return None


def _match_device_comparison(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    assert isinstance(node, cst.Comparison)
    operands = [node.left, *(c.comparator for c in node.comparisons)]
    for operand in operands:
        value = string_value(operand)
        if value is not None and (_CUDA_RE.match(value) or value == "nccl"):
            return Hit(None, f"comparison with {value!r} is False on NPUs and CPUs")
    return None


def _match_nccl_env(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    value = string_value(node)
    if value is not None and re.match(r"^NCCL_[A-Z0-9_]+$", value):
        hccl = "HCCL_" + value[5:]
        return Hit(None, f"{value} configures NCCL only", f"set the matching HCCL_* variable on Ascend (e.g. {hccl}) "
                   "and keep both if the code still runs on GPUs")
    return None


def _match_unmapped_cuda(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    if ctx.in_import:
        return None
    qual = ctx.qualname(node)
    if qual is None or not qual.startswith("torch.cuda."):
        return None
    if ctx.parent_qualname_startswith("torch.cuda."):
        return None  # report the longest name once: torch.cuda.amp.foo, not torch.cuda.amp too
    if qual in CUDA_CALLS or qual in AMP_CALLS or qual.startswith(_HANDLED_CUDA_PREFIXES):
        return None
    return Hit(None, f"{qual} has no device-neutral equivalent in the rule table")


_HANDLED_CUDA_PREFIXES = ("torch.cuda.nvtx", "torch.cuda.graph", "torch.cuda.CUDAGraph",
                          "torch.cuda.make_graphed_callables")


def _match_leftover_literal(node: cst.CSTNode, ctx: Context) -> Optional[Hit]:
    value = string_value(node)
    if value is None or not (_CUDA_RE.match(value) or value == "nccl"):
        return None
    if isinstance(ctx.parent, (cst.Comparison, cst.ComparisonTarget)):
        return None  # NM109 reports it
    if isinstance(ctx.parent, cst.DictElement) and ctx.parent.key is ctx.node:
        return None  # a key names what is mapped (map_location={"cuda:0": ...}), not the device used
    return Hit(None, f"string {value!r} left as written: if it names the device or backend, it is not portable")


# --------------------------------------------------------------------------- the table

_CALL = (cst.Call,)
_REF = (cst.Attribute, cst.Name, cst.Import, cst.ImportFrom)

RULES: tuple[Rule, ...] = (
    Rule("NM001", "cuda-method", "`.cuda()`, `.cuda(i)`, `.cuda(non_blocking=...)` on tensors and modules",
         "`.to(nm.get_device(i), non_blocking=...)`", _CALL, _match_cuda_method, (".cuda(",)),
    Rule("NM002", "torch-device", '`torch.device("cuda")`, `torch.device("cuda", i)`, `torch.device(f"cuda:{i}")`, '
         '`torch.device("cuda" if torch.cuda.is_available() else "cpu")`',
         "`nm.get_device(i)`", _CALL, _match_torch_device, ("cuda",)),
    Rule("NM003", "device-string", '"cuda", "cuda:N" and f"cuda:{i}" used as devices: `.to(...)`, `device=`, '
         '`device_type=`, `torch.autocast("cuda")`, `device = "cuda"`, argparse `--device` defaults',
         "`nm.get_device(i)` where a device is passed; `nm.device_type()` / `str(nm.get_device(i))` "
         "where the value stays a string", _CALL + (cst.Assign, cst.AnnAssign), _match_device_string, ("cuda",)),
    Rule("NM004", "torch-cuda-api", "`torch.cuda.*` calls: is_available, device_count, set_device, current_device, "
         "synchronize, manual_seed(_all), memory statistics, empty_cache, Event, Stream, stream, "
         "current_stream, get_device_name",
         "the `nm.*` function of the same meaning (`nm.accelerator_available()`, `nm.device_count()`, ...)",
         _CALL + (cst.ImportFrom,), _match_cuda_api, ("cuda",)),
    Rule("NM005", "cuda-amp", "`torch.cuda.amp.autocast(...)` and `torch.cuda.amp.GradScaler(...)`",
         "`torch.amp.autocast(device_type=nm.device_type(), ...)` and `nm.grad_scaler(...)`",
         _CALL + (cst.ImportFrom,), _match_amp, ("cuda",)),
    Rule("NM006", "nccl-backend", '"nccl" as the backend of `init_process_group`/`new_group`, `backend=`, argparse '
         "defaults and `backend = ...` variables", "`nm.default_backend()`",
         _CALL + (cst.Assign, cst.AnnAssign), _match_nccl, ("nccl",)),
    Rule("NM007", "ddp-device-ids", "DDP `device_ids=[i]` and `output_device=i` (CPU needs None)",
         "`device_ids=nm.device_ids(i), output_device=nm.output_device(i)`", _CALL, _match_ddp,
         ("device_ids", "output_device")),
    Rule("NM008", "map-location", "`torch.load(..., map_location=...)` with a CUDA string, a dict of CUDA strings "
         "or `lambda storage, loc: storage.cuda(i)`",
         "`map_location=nm.get_device(i)`; dict values `str(nm.get_device(i))`", _CALL, _match_map_location,
         ("cuda",)),
    Rule("NM009", "is-cuda", "`tensor.is_cuda`", "`tensor.device.type == nm.device_type()`",
         (cst.Attribute,), _match_is_cuda, ("is_cuda",)),
    Rule("NM010", "visible-devices", '`os.environ["CUDA_VISIBLE_DEVICES"]`, `os.environ.get(...)`, `os.getenv(...)`, '
         '`"CUDA_VISIBLE_DEVICES" in os.environ`', "`os.environ[nm.visible_devices_env()]`",
         _CALL + (cst.Subscript, cst.Comparison), _match_visible_devices, (VISIBLE_DEVICES,)),
    Rule("NM011", "index-device", "`.to(rank)`, `.to(local_rank)`, `.to(args.gpu)`, `.to(0)`: an integer means a "
         "CUDA device", "`.to(nm.get_device(rank))`", _CALL, _match_index_to, ("rank", "gpu", ".to(0", ".to(1")),
    Rule("NM101", "cuda-extension", "CUDA extensions: `torch.utils.cpp_extension`, `.cu`/`.cuh` sources",
         "port the kernels to Ascend C / torch_npu op-plugin, or keep a pure-PyTorch fallback",
         _REF + (cst.SimpleString,), _match_cu_source, ("cpp_extension", ".cu'", '.cu"', ".cuh")),
    Rule("NM102", "apex", "NVIDIA apex (amp, fused optimizers, SyncBatchNorm)",
         "use torch.amp, torch.optim and torch.nn.SyncBatchNorm (or Ascend's apex fork)",
         _REF, _reference_matcher(("apex",), "{name} is NVIDIA apex, built for CUDA"), ("apex",)),
    Rule("NM103", "cupy", "CuPy arrays and kernels", "use torch tensors, or numpy on the host",
         _REF, _reference_matcher(("cupy",), "{name} is CuPy, which runs on CUDA only"), ("cupy",)),
    Rule("NM104", "triton", "Triton kernels", "keep an eager PyTorch fallback; Triton-Ascend support is separate",
         _REF, _reference_matcher(("triton",), "{name}: Triton kernels are compiled for GPUs"), ("triton",)),
    Rule("NM105", "nvtx", "`torch.cuda.nvtx` ranges", "use torch.profiler.record_function",
         _REF, _reference_matcher(("torch.cuda.nvtx",), "{name} marks ranges for NVIDIA profilers only"), ("nvtx",)),
    Rule("NM106", "cuda-graphs", "CUDA graphs: `torch.cuda.CUDAGraph`, `torch.cuda.graph`, "
         "`make_graphed_callables`", "guard with nm.device_type() == \"cuda\" or use torch.compile",
         _REF, _reference_matcher(("torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.graphs",
                                   "torch.cuda.make_graphed_callables"), "{name} captures CUDA graphs"),
         ("cuda",)),
    Rule("NM107", "float64", "float64 tensors (`torch.float64`, `torch.double`, `.double()`)",
         "use float32 on the device (keep float64 on the CPU only)",
         (cst.Call, cst.Attribute, cst.Name), _match_float64, ("float64", "double")),
    Rule("NM108", "data-parallel", "`torch.nn.DataParallel`", "use DistributedDataParallel with one process per "
         "device (npu-migrate launch)", _REF,
         _reference_matcher(("torch.nn.DataParallel", "torch.nn.parallel.DataParallel"),
                            "{name} is single-process multi-device, which Ascend does not support"),
         ("DataParallel",)),
    Rule("NM109", "device-comparison", '`x.device.type == "cuda"` and other comparisons with "cuda"/"nccl"',
         "compare with nm.device_type() (or nm.default_backend())", (cst.Comparison,), _match_device_comparison,
         ("cuda", "nccl")),
    Rule("NM110", "cuda-version", "`torch.version.cuda`", "check nm.device_type() instead of the CUDA version",
         _REF, _reference_matcher(("torch.version.cuda",), "{name} is None on NPU and CPU builds"), ("cuda",)),
    Rule("NM111", "nccl-env", "NCCL_* environment variables", "set the HCCL_* equivalent on Ascend",
         (cst.SimpleString,), _match_nccl_env, ("NCCL_",)),
    Rule("NM112", "unmapped-cuda-api", "other `torch.cuda.*` APIs", "find the torch.npu / torch.accelerator "
         "equivalent, or guard the call with nm.device_type() == \"cuda\"",
         (cst.Attribute, cst.Name), _match_unmapped_cuda, ("cuda",)),
    Rule("NM113", "cuda-literal", '"cuda", "cuda:N" or "nccl" strings the rewrite rules did not place',
         "use nm.device_type(), nm.get_device(i) or nm.default_backend() if it names the device or backend",
         (cst.SimpleString,), _match_leftover_literal, ("cuda", "nccl")),
)

RULE_CODES: tuple[str, ...] = tuple(r.code for r in RULES)

# Report-only rules judged on the ported tree: a literal is left over only if no rewrite took it.
DEFERRED: frozenset[str] = frozenset({"NM113"})


def rule_by_code(code: str) -> Rule:
    """Return the rule with ``code``.

    Raises:
        KeyError: no rule has that code.
    """
    for rule in RULES:
        if rule.code == code:
            return rule
    raise KeyError(code)


def select_rules(select: Optional[Sequence[str]] = None, ignore: Optional[Sequence[str]] = None) -> tuple[Rule, ...]:
    """The rules chosen by ``select`` and not dropped by ``ignore``; codes may be prefixes (``NM1``).

    Raises:
        ValueError: a code or prefix matches no rule; the message lists the known codes.
    """
    def expand(codes: Sequence[str], option: str) -> set[str]:
        out: set[str] = set()
        for raw in codes:
            code = raw.strip().upper()
            if not code:
                continue
            found = {c for c in RULE_CODES if c.startswith(code)}
            if not found:
                raise ValueError(
                    f"Unknown rule code {raw!r} in {option}. Expected codes or prefixes of: "
                    f"{', '.join(RULE_CODES)}. Run `npu-migrate port --list-rules` to see them."
                )
            out |= found
        return out

    chosen = expand(select, "--select") if select else set(RULE_CODES)
    chosen -= expand(ignore or (), "--ignore")
    return tuple(r for r in RULES if r.code in chosen)


@functools.lru_cache(maxsize=None)
def parse_template(text: str) -> cst.BaseExpression:
    """Parse a :data:`TARGETS` template once per process."""
    return cst.parse_expression(text)
