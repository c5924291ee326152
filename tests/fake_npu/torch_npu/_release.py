"""The torch-npu release the stand-in simulates, and that release's ``torch.npu`` signatures.

``releases.json`` (beside this file) holds, for each torch-npu release the tests compare with (the
sections of tests/fake_npu/NOT_SIMULATED.txt), the torch its METADATA declares and, for every name
``npu.py`` defines, the release's signature (``null`` where it has no Python signature) or the
fact that its ``torch_npu.npu`` lacks the name (``absent``). It is generated from the released
wheels by ``tests/test_fake_npu_surface.py --write`` and checked against them there: nothing in
it is typed by hand.

At import the stand-in simulates the release that pairs with the running torch (:func:`pick`): the
one that declares this torch's version (a local build label such as ``+cpu`` aside), else the
newest one built for its release line (torch 2.7.0 gets the 2.7.1 release). ``FAKE_NPU_RELEASE=
VERSION`` picks another one of the table (the surface test checks every release's signatures on
one torch that way). A torch no release was built for gets an ImportError, as the real package
refuses another torch. :func:`apply` then makes ``torch.npu`` that release's: a name the release
lacks is removed, and a function or class whose parameters differ from ``npu.py``'s (which takes
every parameter any release has) takes the release's signature, so a call the release would
refuse raises TypeError as Python would.

Nothing here imports torch or the rest of the stand-in (a test loads this file on its own).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

TABLE = Path(__file__).with_name("releases.json")
ENV = "FAKE_NPU_RELEASE"
REGENERATE = "NPU_MIGRATE_RELEASES_DIR=DIR python tests/test_fake_npu_surface.py --write [VERSION ...]"

_P = inspect.Parameter


@dataclass(frozen=True)
class Release:
    """One release of the table.

    Attributes:
        version: the torch-npu release (``2.7.1.post11``), the stand-in's ``torch_npu.__version__``.
        requires_torch: the torch its METADATA declares (``torch==2.7.1+cpu``).
        torch: the torch version that requirement names, without a local label (``2.7.1``).
        signatures: ``npu.py``'s names the release has, each with its signature text or ``None``.
        absent: ``npu.py``'s names the release's ``torch_npu.npu`` lacks.
    """

    version: str
    requires_torch: Optional[str]
    torch: str
    signatures: dict[str, Optional[str]]
    absent: tuple[str, ...]


def load(path: Path = TABLE) -> list[Release]:
    """The table's releases, newest first."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [Release(r["version"], r["requires_torch"], r["torch"], dict(r["signatures"]), tuple(r["absent"]))
            for r in data["releases"]]


def _line(version: str) -> tuple[int, ...]:
    """``2.7.1+cpu`` -> ``(2, 7)``: the torch release line of a version."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return tuple(int(p) for p in match.groups()) if match else ()


def pick(torch_version: str, releases: list[Release], requested: Optional[str] = None) -> Release:
    """The release to simulate on ``torch_version`` (``requested``, from FAKE_NPU_RELEASE, wins).

    Raises:
        ImportError: ``requested`` is not in the table, or no release of the table was built for
            ``torch_version``'s release line; one line naming the table's releases and the fix.
    """
    have = ", ".join(r.version for r in releases)
    if requested:
        for release in releases:
            if release.version == requested:
                return release
        raise ImportError(f"{ENV}={requested}: the torch_npu stand-in simulates torch-npu {have} "
                          f"(tests/fake_npu/torch_npu/releases.json); add a release with {REGENERATE}")
    public = torch_version.split("+", 1)[0]
    for release in releases:
        if release.torch == public:
            return release
    for release in releases:
        if _line(release.torch) == _line(public):
            return release
    raise ImportError(f"the torch_npu stand-in simulates no torch-npu release built for torch {torch_version} "
                      f"(its table has {have}); add the release that pairs with it: {REGENERATE}")


# --------------------------------------------------------------------------- signatures


class SourceDefault:
    """A default the release writes as an expression that is not a literal (``torch.float16``):
    kept as its source text, which is its ``repr``. Never passed on: the stand-in's own default applies."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):  # 2.0 ** 16 in GradScaler's defaults
        return _literal(node.left) ** _literal(node.right)
    return ast.literal_eval(node)


def _default(node: Optional[ast.expr]) -> Any:
    if node is None:
        return _P.empty
    try:
        return _literal(node)
    except (ValueError, TypeError, SyntaxError):
        return SourceDefault(ast.unparse(node))


def signature(text: str) -> inspect.Signature:
    """The signature a table entry writes (``(device=None, *, x)``), read with ``ast``."""
    args = ast.parse(f"def _{text}:\n    pass\n").body[0].args
    positional = [(a, _P.POSITIONAL_ONLY) for a in args.posonlyargs] + [(a, _P.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [_P(a.arg, kind, default=_default(d)) for (a, kind), d in zip(positional, defaults)]
    if args.vararg is not None:
        params.append(_P(args.vararg.arg, _P.VAR_POSITIONAL))
    params += [_P(a.arg, _P.KEYWORD_ONLY, default=_default(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg is not None:
        params.append(_P(args.kwarg.arg, _P.VAR_KEYWORD))
    return inspect.Signature(params)


def _same_default(want: Any, have: Any) -> bool:
    if isinstance(want, SourceDefault):
        return want.text == repr(have)
    return type(want) is type(have) and want == have


def same(want: inspect.Signature, have: Optional[inspect.Signature]) -> bool:
    """Names, kinds and defaults agree, in order."""
    if have is None or len(want.parameters) != len(have.parameters):
        return False
    return all(a.name == b.name and a.kind == b.kind and _same_default(a.default, b.default)
               for a, b in zip(want.parameters.values(), have.parameters.values()))


def _signature_of(obj: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _refusal(name: str, want: inspect.Signature, given: int, reason: str) -> str:
    """Python's own words for a call ``want`` refuses (``f() takes 0 positional arguments but 1 was given``)."""
    positional = [p for p in want.parameters.values() if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    if reason == "too many positional arguments":
        least = sum(p.default is _P.empty for p in positional)
        takes = f"from {least} to {len(positional)}" if least != len(positional) else str(len(positional))
        return (f"{name}() takes {takes} positional argument{'' if takes == '1' else 's'} but {given} "
                f"{'was' if given == 1 else 'were'} given")
    missing = re.fullmatch(r"missing a required argument: '(\w+)'", reason)
    if missing:
        kind = "keyword-only" if want.parameters[missing.group(1)].kind is _P.KEYWORD_ONLY else "positional"
        return f"{name}() missing 1 required {kind} argument: '{missing.group(1)}'"
    if reason.startswith("multiple values"):
        return f"{name}() got {reason}"
    return f"{name}() {reason}"  # got an unexpected keyword argument 'x'


def _translator(name: str, want: inspect.Signature, impl: inspect.Signature,
                version: str) -> Callable[[tuple, dict], tuple[tuple, dict]]:
    """A function that checks a call against ``want`` (TypeError as Python's) and returns the
    arguments for ``npu.py``'s implementation (signature ``impl``), by parameter name.

    Raises:
        TypeError: at import, where the implementation cannot take the release's parameters.
    """
    kinds = {p.kind for p in impl.parameters.values()}
    by_name = {p.name: p for p in impl.parameters.values() if p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)}
    variadic = any(p.kind is _P.VAR_POSITIONAL for p in want.parameters.values())
    lacking = []
    for param in want.parameters.values():
        if param.kind is _P.VAR_POSITIONAL:
            prefix = [p.name for p in want.parameters.values() if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
            if _P.VAR_POSITIONAL not in kinds or [p.name for p in impl.parameters.values()][:len(prefix)] != prefix:
                lacking.append(f"*{param.name}")
        elif param.kind is _P.VAR_KEYWORD:
            if _P.VAR_KEYWORD not in kinds:
                lacking.append(f"**{param.name}")
        elif by_name.get(param.name, param).kind is _P.POSITIONAL_ONLY or (
                param.name not in by_name and _P.VAR_KEYWORD not in kinds):
            lacking.append(param.name)
    lacking += [p.name for p in by_name.values() if p.default is _P.empty and p.name not in want.parameters]
    if lacking:
        raise TypeError(f"tests/fake_npu: npu.py's {name}{impl} cannot be torch-npu {version}'s {name}{want} "
                        f"(it differs in {', '.join(lacking)}): give npu.py's {name} every parameter a release has")

    def translate(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        try:
            bound = want.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(_refusal(name, want, len(args), str(exc))) from None
        if variadic:
            return bound.args, bound.kwargs
        call: dict[str, Any] = {}
        for pname, param in want.parameters.items():
            if pname in bound.arguments:
                value = bound.arguments[pname]
            elif param.default is not _P.empty and not isinstance(param.default, SourceDefault):
                value = param.default  # the release's default, where it differs from npu.py's
            else:
                continue
            if param.kind is _P.VAR_KEYWORD:
                call.update(value)
            else:
                call[pname] = value
        return (), call

    return translate


def _function(impl: Callable, want: inspect.Signature, version: str) -> Callable:
    translate = _translator(impl.__name__, want, inspect.signature(impl), version)

    def call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = translate(args, kwargs)
        return impl(*args, **kwargs)

    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(call, attribute, getattr(impl, attribute))
    call.__signature__ = want
    return call


def _method(impl: Callable, translate: Callable) -> Callable:
    def method(this: Any, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = translate(args, kwargs)
        return impl(this, *args, **kwargs)

    return method


def _class(cls: type, want: inspect.Signature, version: str) -> None:
    """Give ``cls`` (in place, so isinstance and the stand-in's own uses still see it) the
    constructor signature ``want``: its Python ``__new__`` and ``__init__`` check calls against it."""
    for special in ("__new__", "__init__"):
        owner = next(k for k in cls.__mro__ if special in vars(k))
        found = vars(owner)[special]
        impl = found.__func__ if isinstance(found, staticmethod) else found
        if not inspect.isfunction(impl):
            continue  # object's or a C type's: takes what the Python one above it passes
        impl_sig = inspect.signature(impl)
        first, *rest = impl_sig.parameters.values()
        method = _method(impl, _translator(cls.__name__, want, impl_sig.replace(parameters=rest), version))
        method.__name__, method.__qualname__ = special, f"{cls.__qualname__}.{special}"
        method.__signature__ = want.replace(parameters=[first, *want.parameters.values()])
        setattr(cls, special, staticmethod(method) if special == "__new__" else method)


def apply(module: ModuleType, release: Release) -> None:
    """Make ``module`` (the stand-in's ``torch_npu.npu``) the release's: names it lacks removed,
    differing signatures replaced by the release's."""
    for name in release.absent:
        if name in vars(module):
            delattr(module, name)
    for name, text in release.signatures.items():
        obj = vars(module).get(name)
        if obj is None or text is None:
            continue
        want = signature(text)
        if same(want, _signature_of(obj)):
            continue
        if isinstance(obj, type):
            _class(obj, want, release.version)
        elif callable(obj):
            setattr(module, name, _function(obj, want, release.version))
