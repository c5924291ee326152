"""A ``torch.cuda`` call made to the target's function of the same name: only the arguments its signature takes.

Usage::

    from npu_migrate.migrate import fit

    adapted = fit.fitted("torch.cuda.is_bf16_supported", torch.cuda.is_bf16_supported,
                         torch.npu.is_bf16_supported, row.cuda_only, "torch.npu.is_bf16_supported",
                         "torch-npu 2.9.1")
    adapted(including_emulation=False)   # torch.npu.is_bf16_supported(): the argument is left out
    fit.plan(inspect.signature(cuda_fn), inspect.signature(npu_fn), row.cuda_only).fits   # False

On npu runtime migration sends ``torch.cuda.X`` to ``torch.npu.X``, whose parameters are the
torch-npu release's, not the installed torch's: ``torch.cuda.is_bf16_supported(including_emulation=
False)`` met a TypeError on every release whose ``is_bf16_supported`` takes no argument, and
``torch.cuda.get_device_name(device=0)`` on every release (its parameter is ``device_name``). The two
signatures are compared once per function, at install (:func:`plan`), never per call:

* a function that takes every call torch.cuda's takes, as it is, is used as it is (no wrapper);
* otherwise a wrapper passes straight through the calls that fit (positional arguments whose
  places agree, keywords the target takes by the same name: one length check and one set test);
  for the others it works out once per shape of call (how many positional arguments, which
  keywords), checked against torch.cuda's signature (torch.cuda's TypeError for a call torch would
  refuse), where each argument goes: the target's parameter of the same name, or the one at the same
  place where the target names it otherwise (``device`` -> ``device_name``: what a positional call
  already did).
  A torch.cuda parameter the target lacks is left out when its value is torch.cuda's default, else
  dropped or refused as its row says (:class:`npu_migrate.cuda_api.row.CudaOnly`): a refusal is
  one line naming the call, the argument, the release and why. A parameter no row decides is
  refused (tests/migrate/test_fit.py fails on it, for every release of the stand-in's table).
"""

from __future__ import annotations

import functools
import inspect
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from npu_migrate.cuda_api.row import CudaOnly
from npu_migrate.errors import MigrationError

_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_KEYWORD = (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)
_PLAIN = (bool, int, float, str, type(None))
UNDECIDED = "runtime migration cannot tell whether the call would mean the same without it"
"""Why a torch.cuda parameter the target lacks, and that no row decides, is refused."""


@dataclass(frozen=True)
class Step:
    """What one of torch.cuda's parameters becomes in the target's call.

    Attributes:
        kind: ``"pass"`` (the target's parameter of the same name, or its ``**kwargs``),
            ``"rename"`` (the target's parameter at the same place, named otherwise), ``"drop"``,
            ``"refuse"`` (a value other than ``default``), ``"varargs"``/``"varkw"`` (the target's own).
        target: the target's parameter name (pass, rename).
        index: its place where it must be passed by place (positional-only), else ``None``.
        default: torch.cuda's default (drop, refuse): that value is always left out.
        why: why a value is dropped or refused.
    """

    kind: str
    target: Optional[str] = None
    index: Optional[int] = None
    default: Any = _P.empty
    why: str = ""


@dataclass(frozen=True)
class Plan:
    """How calls of torch.cuda's function become calls of the target's, read from both signatures once.

    Attributes:
        steps: torch.cuda's parameter name -> :class:`Step`, in torch.cuda's order.
        prefix: how many leading positional arguments go to the same places of the target.
        same: torch.cuda's parameters the target takes by keyword under the same name.
        uncovered: the target's required parameters that no torch.cuda parameter gives (its calls fail).
        fits: the target takes every call torch.cuda's takes, as it is.
    """

    steps: dict[str, Step]
    prefix: int
    same: frozenset[str]
    uncovered: tuple[str, ...]
    fits: bool

    def by_kind(self, *kinds: str) -> list[str]:
        """torch.cuda's parameters whose step is one of ``kinds``, in order."""
        return [name for name, step in self.steps.items() if step.kind in kinds]


def signature(obj: Any) -> Optional[inspect.Signature]:
    """``inspect.signature(obj)``, read once per object; ``None`` where Python cannot say."""
    try:
        return _signature(obj)
    except TypeError:  # unhashable: read it each time (no function or class is)
        return _read(obj)


@functools.lru_cache(maxsize=None)
def _signature(obj: Any) -> Optional[inspect.Signature]:
    return _read(obj)


def _read(obj: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def plan(cuda: inspect.Signature, target: inspect.Signature, cuda_only: Iterable[CudaOnly] = ()) -> Plan:
    """How each parameter of torch.cuda's signature ``cuda`` reaches the target's ``target``.

    ``cuda_only`` (a row's) decides the torch.cuda parameters the target lacks; one it does not name
    is refused (:data:`UNDECIDED`) unless its value is the default.
    """
    decided = {c.param: c for c in cuda_only}
    theirs = list(target.parameters.values())
    by_name = {p.name: p for p in theirs if p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)}
    their_positional = [p for p in theirs if p.kind in _POSITIONAL]
    their_varargs = any(p.kind is _P.VAR_POSITIONAL for p in theirs)
    their_varkw = any(p.kind is _P.VAR_KEYWORD for p in theirs)
    ours = list(cuda.parameters.values())
    our_names = {p.name for p in ours}
    our_positional = [p for p in ours if p.kind in _POSITIONAL]
    steps: dict[str, Step] = {}
    for param in ours:
        place = our_positional.index(param) if param.kind in _POSITIONAL else None
        if param.kind is _P.VAR_POSITIONAL:
            continue  # below: it needs every positional place to agree
        if param.kind is _P.VAR_KEYWORD:
            steps[param.name] = Step("varkw")
            continue
        theirs_same = by_name.get(param.name)
        if theirs_same is not None:
            steps[param.name] = _passed("pass", theirs_same, their_positional)
        elif (place is not None and place < len(their_positional)
              and their_positional[place].name not in our_names):
            steps[param.name] = _passed("rename", their_positional[place], their_positional)
        elif their_varkw and param.kind in _KEYWORD:
            steps[param.name] = Step("pass", param.name)
        else:
            decision = decided.get(param.name)
            steps[param.name] = Step(decision.action if decision else "refuse", default=param.default,
                                     why=decision.why if decision else UNDECIDED)
    prefix = 0
    for place, param in enumerate(our_positional):
        step = steps[param.name]
        if step.kind not in ("pass", "rename") or place >= len(their_positional) or \
                their_positional[place].name != step.target:
            break
        prefix += 1
    for param in ours:
        if param.kind is _P.VAR_POSITIONAL:
            takes = their_varargs and prefix == len(our_positional) == len(their_positional)
            steps[param.name] = Step("varargs") if takes else Step("refuse", default=(), why=UNDECIDED)
    same = frozenset(name for name, step in steps.items()
                     if step.kind == "pass" and step.target == name and cuda.parameters[name].kind in _KEYWORD
                     and (by_name[name].kind in _KEYWORD if name in by_name else their_varkw))
    given = {step.target for step in steps.values() if step.target is not None}
    uncovered = tuple(p.name for p in theirs if p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)
                      and p.default is _P.empty and p.name not in given)
    fits = not uncovered and prefix == len(our_positional) and all(
        (step.kind == "pass" and step.target == name and (cuda.parameters[name].kind not in _KEYWORD or name in same))
        or (step.kind == "varargs") or (step.kind == "varkw" and their_varkw)
        for name, step in steps.items())
    return Plan(steps, prefix, same, uncovered, fits)


def _passed(kind: str, theirs: inspect.Parameter, their_positional: list[inspect.Parameter]) -> Step:
    index = their_positional.index(theirs) if theirs.kind is _P.POSITIONAL_ONLY else None
    return Step(kind, theirs.name, index)


def _is_default(value: Any, default: Any) -> bool:
    """The value is torch.cuda's default (compared only for plain values: a tensor's == is no answer)."""
    return value is default or (type(value) in _PLAIN and type(value) is type(default) and value == default)


def fitted(api: str, cuda: Any, target: Any, cuda_only: Iterable[CudaOnly], target_name: str,
           release: str) -> Any:
    """``target`` as torch.cuda's ``cuda`` is called: ``target`` itself where it takes every such call.

    Args:
        api: the call's name in messages (``"torch.cuda.memory_snapshot"``).
        cuda: torch.cuda's function or class (its signature is the one user code calls).
        target: the target's function or class of the same name.
        cuda_only: the row's decisions for torch.cuda's parameters the target may lack.
        target_name: the target's name in messages (``"torch.npu.memory_snapshot"``).
        release: the release that provides it, in messages (``"torch-npu 2.12.0.post3"``).

    Returns:
        ``target``, or a function taking torch.cuda's calls (for a class: its constructor).
    """
    ours, theirs = signature(cuda), signature(target)
    if ours is None or theirs is None:
        return target  # nothing to compare: calls go through as they are
    how = plan(ours, theirs, cuda_only)
    if how.fits:
        return target
    return _adapter(api, target, ours, how, target_name, release)


@dataclass(frozen=True)
class _Shape:
    """How a call of one shape (so many positional arguments, these keywords) reaches the target.

    Sources are argument places (int) or keywords (str). ``layout``: the target's positional
    arguments in order, each a source or ``(default,)``; ``named``: (source, the target's keyword);
    ``checks``: (source, torch.cuda's parameter, its default, why) for the arguments refused unless
    default; ``extra``: where torch.cuda's ``*args`` start, or None.
    """

    layout: tuple[Any, ...]
    named: tuple[tuple[Any, str], ...]
    checks: tuple[tuple[Any, str, Any, str], ...]
    extra: Optional[int]


_NEVER = object()
"""A default no value is: an argument with it is always refused."""
_SHAPES = 64
"""Call shapes remembered per function: a script calls one function in a few ways."""


def _shape(ours: inspect.Signature, theirs: inspect.Signature, how: Plan, given: int,
           keywords: tuple[str, ...]) -> _Shape:
    """The :class:`_Shape` of a call with ``given`` positional arguments and ``keywords``.

    Raises:
        TypeError: torch.cuda's function refuses such a call (``Signature.bind`` depends only on the shape).
    """
    ours.bind(*range(given), **dict.fromkeys(keywords))
    positional_names = [p.name for p in ours.parameters.values() if p.kind in _POSITIONAL]
    their_positional = [p for p in theirs.parameters.values() if p.kind in _POSITIONAL]
    their_keywords = {p.name for p in theirs.parameters.values() if p.kind in _KEYWORD}
    their_varkw = any(p.kind is _P.VAR_KEYWORD for p in theirs.parameters.values())
    varargs = next((n for n, p in ours.parameters.items() if p.kind is _P.VAR_POSITIONAL), None)
    sources: list[tuple[Any, str, Step]] = []  # (source, torch.cuda's parameter, its step)
    for place in range(given):
        if place < len(positional_names):
            sources.append((place, positional_names[place], how.steps[positional_names[place]]))
        else:
            sources.append((place, varargs, how.steps[varargs]))  # type: ignore[arg-type, index]
    for key in keywords:
        step = how.steps.get(key)
        if step is None or step.kind in ("varargs", "varkw") or ours.parameters[key].kind is _P.POSITIONAL_ONLY:
            # gathered by torch.cuda's **kwargs: the target's by name, or refused
            takes = key in their_keywords or their_varkw
            step = Step("pass", key) if takes else Step("refuse", default=_NEVER, why=UNDECIDED)
        sources.append((key, key, step))
    beyond = given > len(positional_names) and how.steps[varargs].kind == "varargs"  # type: ignore[index]
    extra = len(positional_names) if beyond else None
    slots: dict[int, Any] = {}
    named, checks = [], []
    for source, param, step in sources:
        if step.kind in ("pass", "rename"):
            index = step.index
            if index is None and extra is not None and isinstance(source, int):
                index = source  # before torch.cuda's *args every place agrees (plan)
            if index is None:
                named.append((source, step.target))
            else:
                slots[index] = source
        elif step.kind == "refuse" or (step.kind == "varargs" and extra is None):
            checks.append((source, param, step.default, step.why))
        # varargs beyond the places (extra), drop: nothing to place
    layout = []
    for index in range(max(slots) + 1 if slots else 0):
        if index in slots:
            layout.append(slots[index])
        elif their_positional[index].default is not _P.empty:
            layout.append((their_positional[index].default,))
        else:
            raise TypeError(f"the target needs its argument {index + 1} by place, and the call gives none")
    return _Shape(tuple(layout), tuple(named), tuple(checks), extra)


def _adapter(api: str, target: Callable[..., Any], ours: inspect.Signature, how: Plan, target_name: str,
             release: str) -> Callable[..., Any]:
    prefix, same = how.prefix, how.same
    theirs = signature(target)
    short = api.rpartition(".")[2]
    shapes: dict[tuple[Any, ...], _Shape] = {}

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) <= prefix and same.issuperset(kwargs):
            return target(*args, **kwargs)  # the places and names agree: nothing to change
        key = (len(args), *kwargs)
        shape = shapes.get(key)
        if shape is None:
            try:
                shape = _shape(ours, theirs, how, len(args), tuple(kwargs))  # type: ignore[arg-type]
            except TypeError as exc:
                raise TypeError(f"{short}() {exc}") from None  # torch.cuda's refusal, as torch would
            if len(shapes) < _SHAPES:
                shapes[key] = shape
        for source, param, default, why in shape.checks:
            value = args[source] if isinstance(source, int) else kwargs[source]
            if not _is_default(value, default):
                raise MigrationError(
                    f"{api}({param}={reprlib.repr(value)}) cannot run on {release}: its {target_name} takes no "
                    f"{param}, and {why}; guard the call with a device-type check, or use a torch-npu release "
                    f"whose {target_name} takes {param}.")
        positional = []  # loops, not comprehensions: each of those is a call of its own before Python 3.12
        for source in shape.layout:
            positional.append(args[source] if isinstance(source, int) else source[0])
        if shape.extra is not None:
            positional += args[shape.extra:]
        named = {}
        for source, name in shape.named:
            named[name] = args[source] if isinstance(source, int) else kwargs[source]
        return target(*positional, **named)

    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):  # no __wrapped__: torch.cuda's signature
        if hasattr(target, attribute):
            setattr(call, attribute, getattr(target, attribute))
    call.__signature__ = ours  # type: ignore[attr-defined]
    call.__npu_migrate_fit__ = how  # type: ignore[attr-defined]
    return call
