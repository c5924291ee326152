"""Which object keys may become files in the cache, and where: never anywhere outside the cache directory.

Usage::

    from npu_migrate.data import keys

    keys.unsafe_reason("MNIST/raw/train")           # None: a plain relative path
    keys.unsafe_reason("../../.bashrc")              # "a '..' segment"
    path = keys.destination(target, "MNIST/raw/train")   # target/MNIST/raw/train, checked
    keys.check_inside(root, target)                  # StorageError when symlinks lead out

An object store is a flat map of names: ``a/../../x``, ``a//abs`` (whose relative part is
``/abs``) and ``a\\..\\x`` are valid S3 keys, and a bucket a user fetches from may hold them.
Joined onto a directory, they name files outside it (``~/.bashrc``, a ``.pth`` file: code run at
the next Python start). So a key becomes a local path only when every segment is a plain name:
not empty, not ``.`` or ``..``, without a backslash or a control character, and not one of the
cache's own bookkeeping names (``.NAME.json``, ``.NAME.HOST.part``). And before anything is
written, the real path of the destination's directory (symlinks resolved) must lie inside the
real path of the cache directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from npu_migrate.errors import StorageError
from npu_migrate.textsafe import printable

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BOOKKEEPING = re.compile(r"^\..*\.(json|part)$")  # the cache's .NAME.json, .NAME.HOST.part(.json)


def unsafe_reason(relpath: str) -> str | None:
    """Why ``relpath`` (a key relative to the prefix) cannot be a file in the cache, or ``None``."""
    if not relpath:
        return "an empty name"
    if "\\" in relpath:
        return "a backslash"
    if _CONTROL.search(relpath):
        return "a control character"
    if relpath.startswith("/"):
        return "an absolute path (an empty segment after the prefix)"
    segments = relpath.split("/")
    if "" in segments:
        return "an empty segment ('//')"
    if ".." in segments:
        return "a '..' segment"
    if "." in segments:
        return "a '.' segment"
    if _BOOKKEEPING.match(segments[-1]):
        return "the name of the cache's own bookkeeping files (.NAME.json, .NAME.HOST.part)"
    return None


def check_prefix(url: str, bucket: str, key: str) -> None:
    """Refuse a URL whose bucket or prefix would put its copy outside the cache directory.

    Raises:
        StorageError: ``config``, one line naming the URL and what to change.
    """
    reason = unsafe_reason(bucket) if bucket in (".", "..") or "\\" in bucket else None
    if reason is None and key:
        reason = unsafe_reason(key)
    if reason is not None:
        raise StorageError(
            f"{url}: the prefix has {reason}, so its copy would not stay inside the cache directory. "
            "Write the prefix as plain names separated by single '/' (no '..', '.', '//' or '\\').",
            kind="config", url=url)


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_inside(root: Path, path: Path, url: str = "") -> None:
    """Raise unless the real path of ``path`` (symlinks resolved, as far as it exists) is inside ``root``'s.

    Raises:
        StorageError: ``config``, naming both real paths.
    """
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    if not _inside(real_root, real):
        raise StorageError(
            f"{url or path}: {path} resolves to {real}, outside the cache directory {real_root} (a symlink "
            "inside the cache points out of it); nothing was written. Remove the symlink or use another "
            "cache directory.", kind="config", url=url)


def destination(target: Path, relpath: str, url: str = "") -> Path:
    """``target/relpath``, checked: a safe key whose directory resolves inside ``target``.

    The file itself may be a symlink (the download replaces it; it is never written through).

    Raises:
        StorageError: ``config`` for an unsafe key or a directory that resolves outside.
    """
    reason = unsafe_reason(relpath)
    if reason is not None:
        raise StorageError(f"{url or printable(relpath, 300)}: the object name {printable(repr(relpath), 300)} has {reason}; it is not written "
                           "to the cache.", kind="config", url=url)
    path = target.joinpath(*relpath.split("/"))
    check_inside(target, path.parent, url)
    return path
