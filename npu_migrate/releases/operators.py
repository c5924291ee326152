"""The operators a torch-npu release registers for the NPU, read from its own codegen YAML.

Usage::

    from npu_migrate.releases import operators

    ops = operators.of_release(releases.find("2.14.0"))
    ops.registers("aten::add", "Tensor")        # True
    ops.registers("aten::special_entr", "default")  # False: runs on the host (CPU fallback)
    len(ops.aten)                                # 1080 (the `supported` section of 2.14.0)
    ops = operators.resolve(version=None, op_list=None)   # the audit's order of sources

Every wheel ships ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``. Its sections, as
the wheels write them (2.1.0.post17 and 2.14.0):

* ``supported``: the aten overloads registered for the NPU, each a name (``squeeze.dim``) or a
  mapping whose ``func`` is a name or a whole schema (``mul.Tensor(Tensor self, ...) -> Tensor``);
* ``symint``, ``quant``, ``autograd``: more of the same (SymInt signatures, quantized tensors, and
  overloads whose autograd formula the release replaces);
* ``custom``: the release's own ``npu::`` operators;
* ``backend``, ``cpp_namespace``: scalars, not operators.

An ``--op-list FILE`` is either such a YAML or plain text with one overload a line
(``aten::add.Tensor``; ``#`` starts a comment). Parsed lists are kept in memory per file, so a
second read in one process costs nothing and a first one well under a second.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npu_migrate.releases import pairs
from npu_migrate.releases.wheels import Release, ReleaseNotFound, cache_dir, find, installed

OPERATORS_YAML = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
"""Where a release lists the operators it registers (inside the wheel and the installed package)."""

_ATEN_SECTIONS = ("supported", "symint", "quant", "autograd", "tocpu")
_CUSTOM_SECTIONS = ("custom", "custom_autograd")
_NAME = re.compile(r"^[A-Za-z_][\w.]*")
_CACHE: dict[tuple[str, float], "OperatorList"] = {}


@dataclass(frozen=True)
class OperatorList:
    """What one release registers for the NPU.

    Attributes:
        release: the version (``2.14.0``) or, for ``--op-list``, the file.
        source: ``installed``, ``cache``, ``downloaded`` or ``file``.
        aten: ``name.overload`` of every registered aten overload (``name`` alone for the default).
        custom: names of the release's own ``npu::`` operators.
        requires_torch: the torch the release was made for (its METADATA), None for a file.
    """

    release: str
    source: str
    aten: frozenset[str]
    custom: frozenset[str]
    requires_torch: str | None = None

    def registers(self, op: str, overload: str) -> bool:
        """Whether ``op`` (``aten::add``) with ``overload`` (``Tensor``, ``default``) is registered."""
        namespace, _, name = op.rpartition("::")
        if namespace == "npu":
            return True
        if namespace not in ("aten", ""):
            return False
        key = name if overload in ("default", "") else f"{name}.{overload}"
        return key in self.aten

    def overloads_of(self, name: str) -> list[str]:
        """The registered overloads of aten operator ``name`` (``["add.Tensor", "add.out"]``)."""
        prefix = f"{name}."
        return sorted(k for k in self.aten if k == name or k.startswith(prefix))


def entry_name(entry: Any) -> str | None:
    """``name.overload`` of one YAML entry (a name, or a mapping whose ``func`` is a name or a schema)."""
    text = entry.get("func") if isinstance(entry, dict) else entry
    if not isinstance(text, str):
        return None
    match = _NAME.match(text.strip())
    return match.group(0) if match else None


def parse(text: str, release: str, source: str) -> OperatorList:
    """The operator list in the codegen YAML ``text`` (see the module docstring for its sections).

    Raises:
        ValueError: ``text`` is not such a YAML.
    """
    data = _load_yaml(text)
    if not isinstance(data, dict) or not any(k in data for k in _ATEN_SECTIONS):
        raise ValueError(f"{release}: not a torch-npu operator YAML (no {'/'.join(_ATEN_SECTIONS[:2])} section)")
    aten = {n for s in _ATEN_SECTIONS for n in map(entry_name, data.get(s) or []) if n}
    custom = {n.split(".")[0] for s in _CUSTOM_SECTIONS for n in map(entry_name, data.get(s) or []) if n}
    return OperatorList(release, source, frozenset(aten), frozenset(custom))


def _load_yaml(text: str) -> Any:
    try:
        import yaml
    except ImportError:  # torch does not require pyyaml: read the file's simple layout by hand
        return read_codegen_yaml(text)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader reads 2.14.0's in ~0.1 s
    return yaml.load(text, Loader=loader)


_KEY = re.compile(r"^([A-Za-z_]\w*):(?: (.*))?$")


def _scalar(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def read_codegen_yaml(text: str) -> dict[str, Any]:
    """The codegen YAML's layout without a YAML library: top-level keys, each a scalar or a list of
    scalars and one-level mappings (deeper keys, such as ``dispatch:``'s, are skipped).

    Equal to ``yaml.safe_load`` on the sections :func:`parse` reads (a test checks both wheels).
    """
    data: dict[str, Any] = {}
    section: list[Any] | None = None
    item: dict[str, str] | None = None
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        if indent == 0 and not stripped.startswith("- "):
            match = _KEY.match(stripped)
            if match is None:
                continue
            if match.group(2) and match.group(2).strip() != "[]":
                data[match.group(1)] = _scalar(match.group(2))
                section = None
            else:
                section = data[match.group(1)] = []
            item = None
        elif stripped.startswith("- ") and indent <= 2 and section is not None:
            body = stripped[2:]
            match = _KEY.match(body)
            if match is None:
                section.append(_scalar(body))
                item = None
            else:
                item = {match.group(1): _scalar(match.group(2) or "")}
                section.append(item)
        elif item is not None and indent == 2:  # the item's own keys; deeper ones are skipped
            match = _KEY.match(stripped)
            if match is not None:
                item[match.group(1)] = _scalar(match.group(2) or "")
    return data


def parse_plain(text: str, name: str) -> OperatorList:
    """A plain list: one ``[aten::]name[.overload]`` a line; ``npu::`` lines are custom operators."""
    aten, custom = set(), set()
    for line in text.splitlines():
        word = line.split("#", 1)[0].strip()
        if not word:
            continue
        namespace, _, op = word.rpartition("::")
        if namespace == "npu":
            custom.add(op.split(".")[0])
        else:
            aten.add(op[:-len(".default")] if op.endswith(".default") else op)
    return OperatorList(name, "file", frozenset(aten), frozenset(custom))


def of_release(release: Release) -> OperatorList:
    """The operators ``release`` registers (parsed once per process and file)."""
    stamp = release.location.stat().st_mtime if release.location.exists() else 0.0
    key = (str(release.location), stamp)
    if key not in _CACHE:
        parsed = parse(release.read_text(OPERATORS_YAML), release.version, release.source)
        try:
            requires = release.requires_torch
        except (OSError, KeyError):  # an installed package without its dist-info
            requires = None
        _CACHE[key] = dataclasses.replace(parsed, requires_torch=requires)
    return _CACHE[key]


def from_file(path: str) -> OperatorList:
    """``--op-list FILE``: a codegen YAML or a plain list.

    Raises:
        UsageError: the file is missing, unreadable or neither format.
    """
    from npu_migrate.errors import UsageError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--op-list {path!r} cannot be read ({exc.__class__.__name__}): expected a torch-npu "
                         f"operator YAML ({OPERATORS_YAML}) or one aten::name.overload a line.") from exc
    if re.search(r"^(supported|symint|custom):", text, re.M):
        try:
            return parse(text, path, "file")
        except Exception as exc:  # a YAML error of any kind: say which file and what was expected
            raise UsageError(f"--op-list {path!r} is not valid YAML ({exc.__class__.__name__}): expected "
                             f"{OPERATORS_YAML} from a torch-npu wheel.") from exc
    found = parse_plain(text, path)
    if not found.aten and not found.custom:
        raise UsageError(f"--op-list {path!r} names no operator: expected one aten::name.overload a line.")
    return found


def resolve(version: str | None = None, op_list: str | None = None, torch_version: str | None = None) -> OperatorList:
    """The operator list an audit judges against.

    ``op_list`` (a file) if given; else release ``version`` (installed, cached, or downloaded once);
    else the installed torch_npu; else the newest release made for ``torch_version``'s line
    (:func:`npu_migrate.releases.pairs.same_line` in the cache, else downloaded once).

    Raises:
        UsageError: a bad ``op_list``; ReleaseNotFound: no release reachable (one line, with the fix).
    """
    if op_list:
        return from_file(op_list)
    if version:
        return of_release(find(version))
    here = installed()
    if here is not None:
        return of_release(here)
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    release = pairs.same_line(torch_version)  # the newest cached release made for this torch's line
    if release is None:
        try:
            release = pairs.fetch_pairing(torch_version)  # downloaded once from the index
        except ReleaseNotFound as exc:
            raise ReleaseNotFound(
                f"no torch-npu release for torch {torch_version} is cached in {cache_dir()} and none could be "
                f"downloaded ({exc}). Pass --torch-npu VERSION or --op-list FILE."
            ) from exc
    return of_release(release)
