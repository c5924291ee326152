"""Where a torch-npu release's files come from: the installed package, a cached wheel, or the index.

Usage::

    release = find("2.1.0.post17")      # installed if that version, else cached, else `pip download`
    release.read_text("torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml")
    release.requires_torch               # "torch==2.1.0+cpu", from its METADATA

**Cache.** Downloaded wheels are kept, unopened, as ``torch_npu-<version>-<tags>.whl`` in
:func:`cache_dir`: ``$NPU_MIGRATE_RELEASES_DIR``, else ``$XDG_CACHE_HOME/npu_migrate/torch-npu``
(``~/.cache/...``). A wheel is moved in by an atomic rename, so two processes that download the
same release at once both end with one whole file. Nothing is ever installed or imported: the
files are read from the zip in place.

**Download.** ``python -m pip download --no-deps --only-binary=:all: torch-npu==VERSION`` with this
interpreter's pip, so the user's index configuration (``pip.conf``, ``PIP_INDEX_URL``) applies. A
release built for no wheel tag of this interpreter is fetched for another CPython; its text files
are the same.
"""

from __future__ import annotations

import email.message
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

DISTRIBUTION = "torch-npu"
"""The name on the package index."""

ENV_CACHE = "NPU_MIGRATE_RELEASES_DIR"
"""Where downloaded wheels are kept (default: the user's cache directory)."""

WHEEL_NAME = re.compile(r"^torch_npu-(?P<version>[^-]+)-.+\.whl$")
"""A cached wheel's file name; ``version`` is the release."""
_WHEEL = WHEEL_NAME
# Other CPython versions to ask for when this interpreter has no wheel of a release (its text
# files do not depend on the tag).
_OTHER_PYTHONS = ("3.11", "3.10", "3.9", "3.8")
_DOWNLOAD_TIMEOUT_S = 600  # a wheel is about 30 MB; slow mirrors exist


class ReleaseNotFound(LookupError):
    """No copy of a release could be found or fetched; the message says how to get one."""


@dataclass(frozen=True)
class Release:
    """One torch-npu release's files, in a wheel or in an installed package.

    Attributes:
        version: the release (``2.14.0``, ``2.1.0.post17``).
        location: the wheel file, or the directory the package is installed in.
        source: ``installed``, ``cache`` or ``downloaded``.
    """

    version: str
    location: Path
    source: str

    @property
    def is_wheel(self) -> bool:
        return self.location.suffix == ".whl"

    def read_text(self, path: str) -> str:
        """A file of the release, by its path inside the wheel (``torch_npu/npu/__init__.py``).

        Raises:
            FileNotFoundError: the release has no such file.
        """
        if self.is_wheel:
            with zipfile.ZipFile(self.location) as archive:
                try:
                    return archive.read(path).decode("utf-8")
                except KeyError:
                    raise FileNotFoundError(f"{path} is not in {self.location.name}") from None
        return (self.location / path).read_text(encoding="utf-8")

    def names(self) -> list[str]:
        """Every file path in the release (wheel paths, ``/``-separated)."""
        if self.is_wheel:
            with zipfile.ZipFile(self.location) as archive:
                return archive.namelist()
        root = self.location
        return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                and p.relative_to(root).parts[0].startswith("torch_npu")]

    @cached_property
    def metadata(self) -> email.message.Message:
        """The release's METADATA (its ``Requires-Dist`` lines say which torch it needs)."""
        name = f"torch_npu-{self.version}.dist-info/METADATA"
        if not self.is_wheel:
            found = sorted(self.location.glob("torch_npu-*.dist-info/METADATA"))
            if not found:
                raise FileNotFoundError(f"no torch_npu dist-info in {self.location}")
            return email.parser.Parser().parsestr(found[0].read_text(encoding="utf-8"))
        try:
            text = self.read_text(name)
        except FileNotFoundError:
            with zipfile.ZipFile(self.location) as archive:
                candidates = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
            if not candidates:
                raise
            text = self.read_text(candidates[0])
        return email.parser.Parser().parsestr(text)

    @cached_property
    def requires_torch(self) -> str | None:
        """The release's requirement on torch as pip writes it (``torch==2.14.0.*``), or None."""
        for line in self.metadata.get_all("Requires-Dist") or []:
            requirement = line.split(";")[0].strip()
            match = re.match(r"^torch\b\s*(?:\((?P<paren>[^)]*)\)|(?P<bare>[^;]*))$", requirement)
            if match and not requirement.startswith(("torch-", "torch_", "torchvision", "torchaudio")):
                spec = (match.group("paren") or match.group("bare") or "").replace(" ", "")
                return f"torch{spec}"
        return None


def cache_dir() -> Path:
    """Where downloaded wheels are kept (:data:`ENV_CACHE`, else the user's cache directory)."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "npu_migrate" / "torch-npu"


def _normal(version: str) -> str:
    """Versions compared as pip would (``2.1.0-post17`` and ``2.1.0.post17`` are one)."""
    try:
        from packaging.version import Version

        return str(Version(version))
    except Exception:  # packaging missing or a version it cannot read: compare as written
        return version.strip()


def installed(paths: list[str] | None = None) -> Release | None:
    """The torch_npu installed on ``paths`` (default: ``sys.path``), read from its metadata.

    Nothing is imported: on a node without CANN, importing torch_npu fails.
    """
    import importlib.metadata

    for dist in importlib.metadata.distributions(**({"path": paths} if paths is not None else {})):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") == DISTRIBUTION:
            root = Path(str(dist.locate_file(""))).resolve()
            return Release(dist.version, root, "installed")
    return None


def cached(version: str) -> Release | None:
    """The wheel of ``version`` in :func:`cache_dir`, if one was fetched before."""
    want = _normal(version)
    directory = cache_dir()
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("torch_npu-*.whl")):
        match = _WHEEL.match(path.name)
        if match and _normal(match.group("version")) == want:
            return Release(match.group("version"), path, "cache")
    return None


def _pip_download(version: str, into: Path, extra: list[str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "-d", str(into), *extra,
               f"{DISTRIBUTION}=={version}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S, check=False)


def download(version: str) -> Release:
    """Fetch the wheel of ``version`` from the package index into :func:`cache_dir`.

    Raises:
        ReleaseNotFound: pip could not fetch it; the message has pip's last line and the fix.
    """
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as tmp:
        tries = [[]] + [["--python-version", v] for v in _OTHER_PYTHONS
                        if v != f"{sys.version_info[0]}.{sys.version_info[1]}"]
        last = ""
        for extra in tries:
            try:
                result = _pip_download(version, Path(tmp), extra)
            except (OSError, subprocess.TimeoutExpired) as exc:
                last = str(exc)
                break
            wheels = list(Path(tmp).glob("torch_npu-*.whl"))
            if result.returncode == 0 and wheels:
                target = directory / wheels[0].name
                os.replace(wheels[0], target)  # atomic: a concurrent download ends the same
                match = _WHEEL.match(target.name)
                return Release(match.group("version") if match else version, target, "downloaded")
            last = (result.stderr.strip().splitlines() or [f"pip exited {result.returncode}"])[-1]
            if "No matching distribution" not in result.stderr:
                break  # the index is unreachable or refused: other tags will not help
    raise ReleaseNotFound(
        f"cannot get torch-npu {version}: `pip download --no-deps torch-npu=={version}` failed ({last}). "
        f"Download the wheel on a machine with access to the package index and put it in {directory} "
        f"(or set {ENV_CACHE})."
    )


def find(version: str, *, allow_download: bool = True, paths: list[str] | None = None) -> Release:
    """A copy of release ``version``: the installed package if it is that release, else a cached
    wheel, else one downloaded once into the cache.

    Raises:
        ReleaseNotFound: none of them, with one line saying how to get one.
    """
    here = installed(paths)
    if here is not None and _normal(here.version) == _normal(version):
        return here
    found = cached(version)
    if found is not None:
        return found
    if not allow_download:
        raise ReleaseNotFound(
            f"torch-npu {version} is neither installed nor cached in {cache_dir()}: run "
            f"`pip download --no-deps -d {cache_dir()} torch-npu=={version}`."
        )
    return download(version)


def clear_partial_downloads() -> None:
    """Remove download folders left by killed processes (they never hold a whole wheel)."""
    directory = cache_dir()
    for leftover in directory.glob(".download-*"):
        shutil.rmtree(leftover, ignore_errors=True)
