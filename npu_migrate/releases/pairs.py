"""Which torch a torch_npu release accepts, decided from its declared requirement (PEP 440).

Every torch-npu release names the torch it was built for in its METADATA (``Requires-Dist``),
and that requirement is exact: torch-npu 2.14.0 declares ``torch==2.14.0.*``, torch-npu
2.1.0.post17 declares ``torch==2.1.0+cpu``, the build on PyTorch's CPU index, which plain
``torch 2.1.0`` from PyPI does not satisfy (a local version in a specifier must match). Nothing
here restates a pair: each is read from the installed package's metadata or a release's wheel.

Usage::

    from npu_migrate.releases import pairs

    pairs.accepts("torch==2.1.0+cpu", "2.1.0")          # False: another build of the release
    pairs.install_torch("torch==2.1.0+cpu")             # 'pip install torch==2.1.0+cpu --index-url https://download.pytorch.org/whl/cpu'
    check = pairs.check_installed()                     # the installed pair, from metadata only
    check.declared, check.fatal, check.hint()
    pairs.pairing(torch_version="2.14.0")               # the cached release that accepts it, or None

A pair is *fatal* when torch_npu was built for another minor release of torch (2.1 against 2.14):
importing it can abort the interpreter, so it is refused before ``import torch``. Another build
or patch of the same release (2.1.0 for 2.1.0+cpu, 2.14.1 for 2.14.0.*) loads, but it is a pair
the release does not declare, and ``npu-migrate env`` warns about it.
"""

from __future__ import annotations

import importlib.metadata
import re
import zipfile
from dataclasses import dataclass
from typing import Iterable, Optional

from npu_migrate.releases import wheels

PYTORCH_INDEX = "https://download.pytorch.org/whl"
"""PyTorch's own index: local builds (``+cpu``, ``+cu121``) live at ``{PYTORCH_INDEX}/{local}``."""

_TORCH_DISTS = ("torch",)


def _version(text: str):  # noqa: ANN202 - packaging's Version, imported late
    from packaging.version import Version

    return Version(text)


def requirement_of_metadata(lines: Iterable[str]) -> Optional[str]:
    """The requirement on torch among ``Requires-Dist`` lines (``torch==2.14.0.*``), or ``None``.

    ``torch (==2.1.0+cpu)`` (the older METADATA form) is returned as ``torch==2.1.0+cpu``.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name.lower() in _TORCH_DISTS and requirement.marker is None:
            return f"{requirement.name}{requirement.specifier}"
    return None


def accepts(requirement: str, torch_version: str) -> bool:
    """Whether ``torch_version`` satisfies ``requirement`` (``torch==2.14.0.*``) under PEP 440.

    Local builds count: ``torch==2.1.0+cpu`` accepts ``2.1.0+cpu`` only; ``torch==2.14.0.*``
    accepts ``2.14.0`` and ``2.14.0+cpu`` (a specifier without a local label ignores the candidate's).
    """
    from packaging.requirements import Requirement

    return Requirement(requirement).specifier.contains(_version(torch_version), prereleases=True)


def _pinned(requirement: str) -> Optional[str]:
    """The one version a ``==`` requirement names (``2.14.0`` for ``==2.14.0.*``), else ``None``."""
    from packaging.requirements import Requirement

    specs = list(Requirement(requirement).specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        return specs[0].version[:-2] if specs[0].version.endswith(".*") else specs[0].version
    return None


def local_index(version: str) -> Optional[str]:
    """The index that serves a local build (``+cpu`` -> PyTorch's CPU index), or ``None``."""
    local = _version(version).local
    return f"{PYTORCH_INDEX}/{local}" if local else None


def install_torch(requirement: str) -> str:
    """The pip command that installs the torch ``requirement`` declares, from the right index.

    ``torch==2.14.0.*`` -> ``pip install torch==2.14.0``; ``torch==2.1.0+cpu`` -> the same from
    PyTorch's CPU index (PyPI has no ``+cpu`` builds).
    """
    pinned = _pinned(requirement)
    if pinned is None:
        return f'pip install "{requirement}"'
    name = re.split(r"[=<>!~ ]", requirement, 1)[0]
    index = local_index(pinned)
    return f"pip install {name}=={pinned}" + (f" --index-url {index}" if index else "")


def release_of(version: str) -> tuple[int, ...]:
    """``2.1.0+cpu`` -> ``(2, 1)``: the torch release line a version belongs to."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return tuple(int(p) for p in match.groups()) if match else ()


def built_for(requirement: Optional[str], npu_version: str) -> tuple[int, ...]:
    """The torch release line a torch_npu was built for: its requirement's, else its own version's
    (torch_npu's versions follow torch's: a build from source declares nothing)."""
    if requirement:
        from packaging.requirements import Requirement

        for spec in Requirement(requirement).specifier:
            if spec.operator in ("==", "===", "~=", ">="):
                found = release_of(spec.version)
                if found:
                    return found
    return release_of(npu_version)


def _dist(name: str) -> Optional[importlib.metadata.Distribution]:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class PairCheck:
    """The installed torch and torch_npu, and what the torch_npu release declares.

    Attributes:
        torch: the installed torch version (``2.14.0+cu130``), or ``None``.
        npu: the installed torch_npu version (``2.14.0``), or ``None``.
        requires: torch_npu's requirement on torch (``torch==2.14.0.*``), or ``None`` (not declared).
        declared: whether the installed torch satisfies it (``None`` when there is nothing to compare).
        fatal: torch_npu was built for another torch release line: importing it can abort.
    """

    torch: Optional[str]
    npu: Optional[str]
    requires: Optional[str]
    declared: Optional[bool]
    fatal: bool

    def describe(self) -> str:
        """``torch_npu 2.14.0 declares torch==2.14.0.*`` (or why there is no requirement)."""
        if self.requires is None:
            return f"torch_npu {self.npu} declares no torch requirement (built from source?)"
        return f"torch_npu {self.npu} declares {self.requires}"

    def hint(self) -> str:
        """How to install the pair the release declares (``pip install torch==2.14.0``)."""
        if self.requires is not None:
            return install_torch(self.requires)
        line = ".".join(map(str, built_for(None, self.npu or "")))
        return f'pip install "torch=={line}.*"'

    def warning(self) -> Optional[str]:
        """One line when the installed pair is one the release does not declare, else ``None``."""
        if self.declared is not False or self.fatal:
            return None
        index = local_index(_pinned(self.requires or "") or "0") if self.requires else None
        where = f", a build on PyTorch's index {index}" if index else ""
        return (
            f"torch {self.torch} and torch_npu {self.npu} are a pair the release does not declare: "
            f"{self.describe()}{where}. Install the declared torch: {self.hint()}."
        )


def check(torch_version: Optional[str], npu_version: Optional[str], requires: Optional[str]) -> PairCheck:
    """Decide a pair from the versions and torch_npu's declared requirement."""
    if torch_version is None or npu_version is None:
        return PairCheck(torch_version, npu_version, requires, None, False)
    declared = accepts(requires, torch_version) if requires else None
    have, want = built_for(requires, npu_version), release_of(torch_version)
    fatal = bool(have and want and have != want)
    return PairCheck(torch_version, npu_version, requires, declared, fatal)


def check_installed(npu_dist: str = wheels.DISTRIBUTION) -> PairCheck:
    """The pair installed in this environment, read from package metadata (nothing is imported)."""
    torch_dist, npu = _dist("torch"), _dist(npu_dist)
    requires = requirement_of_metadata(npu.requires or []) if npu is not None else None
    return check(torch_dist.version if torch_dist else None, npu.version if npu else None, requires)


def cached_releases() -> list[wheels.Release]:
    """Every torch-npu wheel in the cache (:func:`wheels.cache_dir`), newest first."""
    from packaging.version import InvalidVersion

    directory = wheels.cache_dir()
    found = []
    for path in directory.glob("torch_npu-*.whl") if directory.is_dir() else []:
        match = wheels.WHEEL_NAME.match(path.name)
        try:
            if match:
                found.append((_version(match.group("version")), wheels.Release(match.group("version"), path, "cache")))
        except InvalidVersion:
            continue  # not a wheel pip would have written
    return [release for _, release in sorted(found, key=lambda pair: pair[0], reverse=True)]


def pairing(torch_version: str, candidates: Optional[Iterable[wheels.Release]] = None) -> Optional[wheels.Release]:
    """The newest release among ``candidates`` (default: the cached wheels) that accepts ``torch_version``."""
    for release in cached_releases() if candidates is None else candidates:
        try:
            requires = release.requires_torch
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            continue  # a damaged wheel says nothing
        if requires and accepts(requires, torch_version):
            return release
    return None


def same_line(torch_version: str, candidates: Optional[Iterable[wheels.Release]] = None) -> Optional[wheels.Release]:
    """The release among ``candidates`` (default: the cached wheels) built for ``torch_version``'s
    release line, whether or not it accepts that build of torch: the newest that pins this torch
    release (2.9.0.post9's ``torch==2.9.0+cpu`` for torch 2.9.0+cu128, not 2.9.1's newer pin), else
    the newest of the line."""
    public = _version(torch_version).public
    line = []
    for release in cached_releases() if candidates is None else candidates:
        try:
            if built_for(release.requires_torch, release.version) == release_of(torch_version):
                line.append(release)
                pinned = _pinned(release.requires_torch or "")
                if pinned is not None and _version(pinned).public == public:
                    return release
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            continue
    return line[0] if line else None


def fetch_pairing(torch_version: str) -> wheels.Release:
    """Download (once, into the cache) the newest torch-npu of ``torch_version``'s release line and
    return it if it accepts that torch; only on request (``npu-migrate env --releases``).

    Raises:
        ReleaseNotFound: the index has no such release, or pip could not reach it.
    """
    try:  # the releases of this very torch release first (torch 2.9.0: 2.9.0.postN, not 2.9.1)
        return wheels.download(f"{_version(torch_version).base_version}.*")
    except wheels.ReleaseNotFound:
        line = ".".join(map(str, release_of(torch_version)))
        return wheels.download(f"{line}.*")
