"""Stand-ins keep torch's signatures: what user code runs accepts exactly the calls torch's function accepts.

Usage::

    from npu_migrate.migrate.signatures import answer, shaped, mismatch

    nothing = answer(lambda: None)                   # ignores its arguments
    impl = shaped(torch.cuda.synchronize, nothing)   # takes torch's exactly
    mismatch(impl, torch.cuda.synchronize, "torch.cuda.synchronize")     # None: same signature
    installed_mismatches()   # every stand-in installed now whose signature is not torch's

A stand-in whose signature differs from torch's breaks the scripts that call it another way:
timm calls ``torch.cuda.stream(stream=s)``, and a stand-in ``lambda s=None: ...`` died with
"unexpected keyword argument 'stream'". Two kinds of stand-in are therefore allowed:

* an :func:`answer` that does not depend on the arguments: :func:`shaped` gives it torch's own
  signature, read from the function it replaces, so it raises torch's ``TypeError`` for a call
  torch would reject and takes every call torch takes, on every torch version;
* a hand-written function or class with torch's parameters (names, kinds, defaults), checked by
  tests/migrate/test_signatures.py against the running torch.

Where a stand-in cannot match, :data:`DIFFERENCES` says why, in this one place.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

DIFFERENCES: dict[str, str] = {
    # api: why its stand-in's signature differs from torch's (tests/migrate/test_signatures.py reads this)
    "torch.cuda.Event": "torch >= 2.6 adds external=False; HostEvent takes the newest signature, so older torch's "
                        "calls are all accepted",
    "torch.cuda.get_device_properties": "older torch (2.1) requires device, newer defaults it to None; the stand-in "
                                        "takes the newest, so older torch's calls are all accepted",
    "torch.cuda.amp.autocast": "torch wraps it in a deprecation shim taking (*args, **kwargs); the stand-in takes "
                               "autocast's own parameters (enabled, dtype, cache_enabled)",
    "torch.cuda.amp.GradScaler": "torch's deprecation shim takes (*args, **kwargs) and forwards to torch.amp.GradScaler; "
                                 "so does the stand-in",
}
"""Stand-ins whose signature differs from the torch object they replace, with the reason."""

_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class Answer:
    """A stand-in's result that does not depend on its arguments; :func:`shaped` gives it torch's signature."""

    value: Callable[[], Any]


def answer(value: Callable[[], Any]) -> Answer:
    """Mark ``value()`` as the answer to every call, whatever torch's function is passed."""
    return Answer(value)


def signature(obj: Any) -> inspect.Signature | None:
    """torch's signature of ``obj`` (through deprecation wrappers), or None where Python cannot say."""
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def shaped(original: Any, impl: Any) -> Any:
    """``impl`` as user code calls it: an :class:`Answer` takes ``original``'s exact signature."""
    if not isinstance(impl, Answer):
        return impl
    value = impl.value
    sig = signature(original)
    if sig is None:
        return lambda *args, **kwargs: value()
    # A call without arguments is valid when no parameter is required: no binding on the fast
    # path (torch.cuda.synchronize() runs every step of a training loop).
    bare_ok = all(p.default is not _EMPTY or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values())

    def call(*args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not bare_ok:
            sig.bind(*args, **kwargs)  # torch's TypeError for a call torch would reject
        return value()

    call.__signature__ = sig  # type: ignore[attr-defined]
    call.__name__ = getattr(original, "__name__", "answer")
    call.__npu_migrate_bare__ = value if bare_ok else None  # type: ignore[attr-defined] # what call() returns
    return call


def _params(obj: Any) -> list[tuple[str, str, Any]] | None:
    sig = signature(obj)  # through our own decorators (contextlib.contextmanager)
    if sig is None:
        return None
    return [(p.name, p.kind.name, "<required>" if p.default is _EMPTY else p.default) for p in sig.parameters.values()]


def mismatch(impl: Any, original: Any, api: str) -> str | None:
    """Why ``impl`` does not take ``original``'s calls (a line), or None: same parameters, or documented.

    A wrapper of ``original`` itself (``functools.wraps``) that passes its arguments through to
    it takes torch's signature by construction.
    """
    if getattr(impl, "__wrapped__", None) is original:
        return None
    sig = signature(original)
    ours, theirs = _params(impl), (None if sig is None else _params_of_original(sig))
    if theirs is None or ours == theirs or api in DIFFERENCES:
        return None
    return f"{api}: the stand-in takes {_show(ours)}, torch's takes {_show(theirs)}"


def installed_mismatches() -> list[str]:
    """One line per stand-in installed now (function or class) that does not take torch's signature.

    Wrappers that pass every argument through to torch's own function (``device=`` mapping,
    ``Tensor.to``) are torch's signature by construction and are not stand-ins.
    """
    from npu_migrate.migrate.callers import SwitchMeta
    from npu_migrate.migrate.state import STATE

    found = []
    for owner, name, _had, old in STATE.patches:
        new = getattr(owner, name, None)
        if isinstance(new, SwitchMeta):
            impl, api = type.__getattribute__(new, "_make"), type.__getattribute__(new, "_api")  # what user code calls
        elif hasattr(new, "__npu_migrate_impl__"):
            impl, api = new.__npu_migrate_impl__, new.__npu_migrate_api__
        else:
            continue
        line = mismatch(impl, old, api)
        if line is not None and line not in found:
            found.append(line)
    return found


def _params_of_original(sig: inspect.Signature) -> list[tuple[str, str, Any]]:
    return [(p.name, p.kind.name, "<required>" if p.default is _EMPTY else p.default) for p in sig.parameters.values()]


def _show(params: list[tuple[str, str, Any]] | None) -> str:
    if params is None:
        return "(?)"
    return "(" + ", ".join(f"{n}{'' if d == '<required>' else '=' + repr(d)} [{k.lower()}]" for n, k, d in params) + ")"
