"""Where data and checkpoints live: local paths, ``s3://bucket/prefix`` and ``oss://bucket/prefix``.

Usage::

    from npu_migrate.data import storage

    storage.parse_url("oss://bucket/mnist")             # StorageURL(scheme='oss', bucket='bucket', key='mnist')
    storage.list_files("s3://bucket/mnist")             # [RemoteFile('MNIST/raw/...', size, etag), ...]
    storage.write_bytes_atomic("s3://bucket/ckpt/last.pt", payload)
    payload = storage.read_bytes("s3://bucket/ckpt/last.pt")

Remote URLs go through fsspec and s3fs (the ``storage`` extra), imported on first use of such a
URL: local paths never import them. Credentials and endpoints come only from the environment and
the AWS config files, never from flags or URLs (see :data:`SCHEMES`):

- ``s3://``: botocore's own chain: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
  ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and ``~/.aws/config``; the endpoint from
  ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (S3-compatible stores such as Huawei OBS, MinIO).
- ``oss://``: Alibaba Cloud OSS through its S3-compatible endpoint. ``OSS_ENDPOINT``,
  ``OSS_ACCESS_KEY_ID``, ``OSS_ACCESS_KEY_SECRET``, ``OSS_SESSION_TOKEN`` and ``OSS_REGION`` are
  used where set, each falling back to its ``AWS_*`` counterpart (and ``AWS_PROFILE``).

Every failure becomes one :class:`~npu_migrate.errors.StorageError` line that names the URL and the
fix, and never a credential (messages are also scrubbed of every credential value in the
environment).

This module holds the operations (list, read, stream, check, write) and re-exports the rest, so
``storage.X`` keeps working: URLs and schemes are :mod:`~npu_migrate.data.urls`'s, the client's
settings and filesystem :mod:`~npu_migrate.data.client`'s, the error lines
:mod:`~npu_migrate.data.failures`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from npu_migrate import fileio
from npu_migrate.data.client import (
    _FILESYSTEMS, DEFAULT_ATTEMPTS, DEFAULT_TIMEOUT_S, ENV_RETRIES, ENV_TIMEOUT, EXTRA,
    _botocore_has_checksum_options, attempts, client_settings, endpoint, filesystem, shown_endpoint, timeout_s,
)
from npu_migrate.data.failures import _missing, _NoSuchBucket, translate
from npu_migrate.data.urls import SCHEMES, RemoteFile, Scheme, StorageURL, is_remote, join, parse_url
from npu_migrate.errors import StorageError

__all__ = [
    "DEFAULT_ATTEMPTS", "DEFAULT_TIMEOUT_S", "ENV_RETRIES", "ENV_TIMEOUT", "EXTRA", "SCHEMES", "RemoteFile", "Scheme",
    "StorageError", "StorageURL", "attempts", "check_bucket", "client_settings", "endpoint", "filesystem",
    "is_remote", "join", "list_files", "normalize_etag", "parse_url", "read_bytes", "shown_endpoint", "stream_from",
    "timeout_s", "translate", "write_bytes_atomic",
    "_FILESYSTEMS", "_botocore_has_checksum_options",  # the tests clear the cache and ask botocore's version
]


def list_files(url: str | os.PathLike) -> list[RemoteFile]:
    """Every object under the prefix ``url`` (recursively), with sizes and ETags.

    Raises:
        StorageError: a missing bucket, bad credentials, an unreachable endpoint...
    """
    parsed = parse_url(url)
    if not parsed.is_remote:
        raise ValueError(f"list_files needs an s3:// or oss:// URL, got {parsed.url!r}")
    fs = filesystem(parsed)
    try:
        found = fs.find(parsed.path, detail=True, refresh=True) if parsed.key else \
            fs.find(parsed.bucket, detail=True, refresh=True)
        if not found:
            fs.ls(parsed.bucket, refresh=True)  # an empty listing: tell "no bucket" from "no files"
    except Exception as exc:  # noqa: BLE001 - translated into one line
        raise _missing(fs, parsed, exc) from exc
    base = parsed.path.rstrip("/") + "/"
    files = []
    for name, info in sorted(found.items()):
        if info.get("type") != "file" or not name.startswith(base) or name.endswith("/"):
            continue
        files.append(RemoteFile(name[len(base):], int(info["size"]), normalize_etag(info.get("ETag", ""))))
    return files


def normalize_etag(etag: str) -> str:
    """``"ABC"`` -> ``abc``: S3 quotes ETags, OSS writes MD5s in upper case."""
    return etag.strip().strip('"').lower()


def stream_from(url: str, start: int, *, etag: str | None = None, block: int = 2**20) -> Iterator[bytes]:
    """The bytes of the object ``url`` from ``start`` to its end, as they arrive, in one GET.

    One streaming request rather than one request per block: per-request latency would
    otherwise dominate (see benchmarks/bench_storage.py).

    Args:
        etag: the ETag the bytes must belong to (normalised); another one raises
            ``StorageError(kind="incomplete")``, since the object changed since it was listed.
        block: the size of the pieces yielded.

    Raises:
        StorageError: for anything the request or the stream raised, e.g. ``unreachable`` when
            the connection breaks off mid-transfer.
    """
    from fsspec.asyn import sync

    parsed = parse_url(url)
    fs = filesystem(parsed)
    try:
        response = sync(fs.loop, fs._call_s3, "get_object", Bucket=parsed.bucket, Key=parsed.key,
                        Range=f"bytes={start}-")
    except Exception as exc:  # noqa: BLE001
        raise _missing(fs, parsed, exc) from exc
    body = response["Body"]
    try:
        if etag is not None and normalize_etag(response.get("ETag", "")) != etag:
            raise StorageError(f"{parsed.url}: the object changed while it was being downloaded. Run again.",
                               kind="incomplete", url=parsed.url)
        while True:
            try:
                piece = sync(fs.loop, body.read, block)
            except Exception as exc:  # noqa: BLE001
                raise translate(exc, parsed) from exc
            if not piece:
                return
            yield piece
    finally:
        body.close()


def read_bytes(url: str | os.PathLike) -> bytes:
    """The whole file or object at ``url``.

    Raises:
        StorageError: ``missing_object`` when there is none; any other failure too.
    """
    parsed = parse_url(url)
    if not parsed.is_remote:
        try:
            return Path(parsed.key).read_bytes()
        except OSError as exc:
            raise translate(exc, parsed) from exc
    fs = filesystem(parsed)
    try:
        return fs.cat_file(parsed.path)
    except Exception as exc:  # noqa: BLE001
        raise _missing(fs, parsed, exc) from exc


def check_bucket(url: str | os.PathLike) -> None:
    """Fail early, in one line, when the bucket of ``url`` is missing, denied or unreachable.

    Local paths are not checked (their directory is created on the first write).
    """
    parsed = parse_url(url)
    if not parsed.is_remote:
        return
    fs = filesystem(parsed)
    try:
        fs.ls(parsed.bucket, refresh=True)
    except Exception as exc:  # noqa: BLE001
        error = translate(exc, parsed)
        if error.kind == "missing_object":
            error = translate(_NoSuchBucket(), parsed)
        raise error from exc


def write_bytes_atomic(url: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``url`` so that readers see the old content or the new, never a part.

    Local files: a fresh temporary file in the same directory (``fileio.write_atomic``), fsync,
    then ``os.replace``; the mode is what umask allows, as for ``open(path, "w")``. Objects: one
    PUT (or a multipart upload, which S3 and OSS only publish when it completes); the previous
    object stays readable until then.
    """
    parsed = parse_url(url)
    if not parsed.is_remote:
        path = Path(parsed.key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fileio.write_atomic(path, data, mode=fileio.default_mode())  # never through a planted symlink
        except OSError as exc:
            raise translate(exc, parsed) from exc
        return
    if not parsed.key:
        raise StorageError(f"{parsed.url}: no object name after the bucket.", kind="config", url=parsed.url)
    fs = filesystem(parsed)
    try:
        fs.pipe_file(parsed.path, data)
    except Exception as exc:  # noqa: BLE001
        error = translate(exc, parsed)
        if error.kind == "missing_object":  # a PUT answered 404: the bucket is what is missing
            error = translate(_NoSuchBucket(), parsed)
        raise error from exc
