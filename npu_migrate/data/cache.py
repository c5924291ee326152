"""One verified copy of remote data per node: local rank 0 downloads, the other ranks wait.

Usage::

    from npu_migrate.data import cache

    root = cache.fetch("s3://bucket/datasets", include=["MNIST/raw/*"])   # every rank calls it
    datasets.MNIST(root)                                                   # a local directory

``fetch`` returns local paths unchanged. For a remote prefix, every rank calls it: local rank 0
lists the prefix, downloads what is missing into ``cache_dir/<scheme>/<bucket>/<prefix>/`` with a
progress bar on global rank 0, and the other ranks of its node wait for it in a collective that
also carries its outcome, so an error stops every rank with the same line instead of a hang.

The files of one object ``NAME`` in the cache directory (the protocol, written down here):

- ``NAME``: the complete file. Only ``os.replace`` creates it, after its size and MD5 matched.
- ``.NAME.<host>.part``: bytes downloaded so far, by one streaming GET from the ``.part``'s size.
- ``.NAME.<host>.part.json``: ``{"etag", "size"}`` of the object the ``.part`` holds bytes of. A
  later run continues the ``.part`` only if the object still has that ETag and size; otherwise it
  starts over. (``<host>`` keeps nodes that share a cache directory out of each other's way.)
- ``.NAME.json``: ``{"etag", "size"}`` of the object ``NAME`` was verified against. A file counts
  as cached only when this matches the listing and ``NAME`` has that size; so a crash between
  the replace and this record means a download, never a wrong file.

Verification: the size always; the MD5 of the bytes against the ETag when the ETag is an MD5
(single-part uploads on S3 and OSS); multipart ETags (``...-N``) are checked by size only while
downloading. In a shared cache (see :mod:`npu_migrate.data.verify`) a cached file is served only
after its bytes were hashed against the listing's ETag; a file that fails is downloaded again.

The cache stays inside itself (see :mod:`npu_migrate.data.keys`): a URL whose prefix has ``..``,
``.``, ``//`` or ``\\`` is refused, an object whose key would not be a plain relative path is skipped
with one warning naming it, and every destination's directory must resolve (symlinks followed)
inside the cache directory before anything is written. Files are never written through a symlink.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import socket
import stat
from pathlib import Path
from typing import Callable, Sequence

from npu_migrate import fileio
from npu_migrate.data import keys, storage, verify
from npu_migrate.errors import StorageError
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)

ENV_CACHE_DIR = "NPU_MIGRATE_CACHE_DIR"
DEFAULT_CHUNK = 2**20  # bytes per write and per progress update


def default_cache_dir() -> Path:
    """``$NPU_MIGRATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/npu_migrate``, else ``~/.cache/npu_migrate``."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "npu_migrate"


def local_dir(url: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``fetch`` keeps the copy of the prefix ``url``.

    Raises:
        StorageError: ``config`` for a bucket or prefix with ``..``, ``.``, ``//`` or ``\\``.
    """
    parsed = storage.parse_url(url)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    raw_key = re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]*/?", "", parsed.url).rstrip("/")  # before parse_url's strip
    keys.check_prefix(parsed.url, parsed.bucket, raw_key)
    return root.joinpath(parsed.scheme, parsed.bucket, *[p for p in parsed.key.split("/") if p])


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def fetch(
    url: str | os.PathLike,
    *,
    include: Sequence[str] = ("*",),
    cache_dir: str | os.PathLike | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """A local directory holding the files of ``url`` that match ``include``.

    Call it on every rank. Local paths come back as they are. For a remote prefix, local rank 0
    (``LOCAL_RANK``) downloads; when torch.distributed is initialised, every rank then joins one
    ``all_gather_object`` that carries each node's outcome.

    Args:
        url: a local directory, ``s3://bucket/prefix`` or ``oss://bucket/prefix``.
        include: glob patterns (``fnmatch``) of paths relative to the prefix; ``*`` also
            matches ``/``.
        cache_dir: the cache's root (default: :func:`default_cache_dir`).
        chunk_size: bytes per write (and per ``progress`` call); an interrupted download
            resumes at the last byte written.
        progress: called with the byte count of each chunk written (default: a tqdm bar on
            global rank 0).

    Returns:
        The local directory: ``url`` itself, or its copy in the cache.

    Raises:
        StorageError: one line naming the URL and the fix, on every rank, when any node's
            download failed or nothing matched ``include``.

    The other ranks wait inside a collective, so the process group's timeout (30 minutes by
    default for gloo, 10 for nccl/hccl; ``init_process_group(timeout=...)``) bounds how long a
    download may take; fill the cache beforehand for larger data sets.
    """
    text = os.fspath(url)
    if not storage.is_remote(text):
        return Path(storage.parse_url(text).key)
    target = local_dir(text, cache_dir)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    import torch.distributed as dist

    if _env_int("WORLD_SIZE", 1) > 1 and not (dist.is_available() and dist.is_initialized()):
        # Without a process group the other ranks of a node could not wait for the download.
        raise StorageError(
            f"{text}: in a job of {_env_int('WORLD_SIZE', 1)} processes, call fetch() after the process group "
            "is initialised (npu_migrate.init_distributed()), on every rank.", kind="config", url=text)
    failure: tuple[str, str] | None = None
    if _env_int("LOCAL_RANK", 0) == 0:
        try:
            keys.check_inside(root, target, text)
            sync(text, target, include=include, chunk_size=chunk_size, progress=progress, root=root)
        except StorageError as exc:
            failure = (str(exc), exc.kind)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they would wait forever
            failure = (str(storage.translate(exc, text)), "other")
    failure = _share(failure)
    if failure is not None:
        raise StorageError(failure[0], kind=failure[1], url=text)
    return target


def _share(failure: tuple[str, str] | None) -> tuple[str, str] | None:
    """The first failure of any rank, seen by every rank (a no-op outside a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return failure
    outcomes: list[tuple[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, failure)
    return next((item for item in outcomes if item is not None), None)


def sync(
    url: str,
    target: Path,
    *,
    include: Sequence[str] = ("*",),
    chunk_size: int = DEFAULT_CHUNK,
    progress: Callable[[int], None] | None = None,
    root: Path | None = None,
) -> list[Path]:
    """Bring ``target`` up to date with the matching objects under ``url`` (one process).

    Objects whose key is not a plain relative path are skipped with a warning naming each.

    Args:
        root: the cache directory ``target`` lies in (default: ``target``): where the check of
            who else can write (a shared cache) stops.

    Returns:
        The local files, complete and verified.
    """
    files = []
    for item in storage.list_files(url):
        if not any(fnmatch.fnmatch(item.relpath, p) for p in include):
            continue
        reason = keys.unsafe_reason(item.relpath)
        if reason is not None:
            logger.warning("%s: skipped the object %s: its name has %s, so it would not be a file inside the "
                           "cache directory %s", url, printable(repr(item.relpath), 300), reason, target)
        else:
            files.append(item)
    if not files:
        raise StorageError(
            f"{url}: no objects matching {', '.join(include)} under this prefix. Upload the data there "
            "in the layout the local directory would have, or fix the prefix.", kind="missing_object", url=url)
    todo = [f for f in files if not is_cached(target, f, root=root)]
    if not todo:
        logger.info("Using the cached copy of %s in %s (%d file(s))", url, target, len(files))
        return [target / f.relpath for f in files]
    total = sum(f.size for f in todo)
    logger.info("Downloading %d of %d file(s), %.1f MB, from %s into %s",
                len(todo), len(files), total / 1e6, url, target)
    bar = None
    if progress is None:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="download", leave=False, dynamic_ncols=True,
                   disable=True if _env_int("RANK", 0) != 0 else None)
        progress = bar.update
    try:
        for item in todo:
            dest = keys.destination(target, item.relpath, url)  # checked before any directory is made
            dest.parent.mkdir(parents=True, exist_ok=True)
            keys.check_inside(target, dest.parent, url)  # and again, now that it exists
            download(storage.join(url, item.relpath), item, dest,
                     chunk_size=chunk_size, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    return [target / f.relpath for f in files]


def _record(path: Path) -> Path:
    return path.with_name(f".{path.name}.json")


def _part(path: Path) -> Path:
    return path.with_name(f".{path.name}.{socket.gethostname()}.part")


def _read_json(path: Path) -> dict:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as fh:
            value = json.load(fh)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, value: dict) -> None:
    fileio.write_atomic(path, json.dumps(value), mode=fileio.default_mode())


def is_cached(target: Path, item: storage.RemoteFile, root: Path | None = None) -> bool:
    """True when ``target/item.relpath`` is complete and was verified against this very object.

    In a shared cache (:func:`verify.is_shared` from ``root``, default ``target``), the bytes are
    hashed against the ETag too; a file that fails is not cached (and is downloaded again).
    """
    if keys.unsafe_reason(item.relpath) is not None:
        return False
    path = target.joinpath(*item.relpath.split("/"))
    record = _read_json(_record(path))
    try:
        st = path.lstat()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or not (record.get("etag") == item.etag and record.get("size") == item.size
                                            == st.st_size):
        return False
    if verify.is_shared(root or target, path):
        if verify.matches_etag(path, item.etag, item.size) is not True:
            logger.warning("%s in the shared cache does not hold the bytes of the object (ETag %s); downloading "
                           "it again", path, item.etag)
            return False
    return True


def download(url: str, item: storage.RemoteFile, dest: Path, *, chunk_size: int = DEFAULT_CHUNK,
             progress: Callable[[int], None] | None = None) -> Path:
    """Download one object to ``dest`` through a ``.part`` file, resuming a matching one.

    Raises:
        StorageError: ``incomplete`` when the bytes do not match the size or ETag (the
            ``.part`` is deleted, so the next run starts over); any client error otherwise
            (the ``.part`` is kept, so the next run resumes).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, state = _part(dest), _part(dest).with_name(_part(dest).name + ".json")
    expected = {"etag": item.etag, "size": item.size}
    digest = hashlib.md5()  # noqa: S324 - S3's ETag of a single-part upload is the MD5
    offset = 0
    if part.is_file() and not part.is_symlink() and _read_json(state) == expected \
            and part.stat().st_size <= item.size:
        with open(os.open(part, os.O_RDONLY | os.O_NOFOLLOW), "rb") as fh:
            for block in iter(lambda: fh.read(2**20), b""):
                digest.update(block)
                offset += len(block)
        logger.info("Resuming %s at %d of %d bytes", url, offset, item.size)
        if progress is not None and offset:
            progress(offset)
    else:
        part.unlink(missing_ok=True)
        _write_json(state, expected)
    with open(fileio.open_private_append(part, mode=fileio.default_mode()), "ab") as fh:
        try:
            if offset < item.size:
                for block in storage.stream_from(url, offset, etag=item.etag, block=chunk_size):
                    fh.write(block)
                    digest.update(block)
                    offset += len(block)
                    if progress is not None:
                        progress(len(block))
        except StorageError as exc:
            if exc.kind == "incomplete":  # the object changed: these bytes are of no use
                fh.close()
                part.unlink(missing_ok=True)
                state.unlink(missing_ok=True)
            raise
        finally:
            if not fh.closed:
                fh.flush()
                os.fsync(fh.fileno())  # what arrived is kept for the next run to continue from
    problem = None
    if offset != item.size:
        problem = f"got {offset} bytes, the object has {item.size}"
    elif verify.is_md5(item.etag) and digest.hexdigest() != item.etag:
        problem = f"the MD5 of the bytes is {digest.hexdigest()}, the ETag says {item.etag}"
    if problem:
        part.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        raise StorageError(f"{url}: the download is incomplete or corrupt ({problem}); it was discarded. "
                           "Run again to download it afresh.", kind="incomplete", url=url)
    _record(dest).unlink(missing_ok=True)
    os.replace(part, dest)
    _write_json(_record(dest), expected)
    state.unlink(missing_ok=True)
    return dest

