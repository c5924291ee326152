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
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal
from urllib.parse import urlsplit, urlunsplit

from npu_migrate import fileio, redact
from npu_migrate.errors import StorageError

logger = logging.getLogger(__name__)

EXTRA = "pip install 'npu-migrate[storage]'"
ENV_TIMEOUT = "NPU_MIGRATE_STORAGE_TIMEOUT"
ENV_RETRIES = "NPU_MIGRATE_STORAGE_RETRIES"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_ATTEMPTS = 3


@dataclass(frozen=True)
class Scheme:
    """How one URL scheme maps onto an S3 client.

    Attributes:
        name: the URL scheme.
        endpoint_env: variables that may hold the endpoint URL, first set wins.
        key_env, secret_env, token_env, region_env: variables passed to the client explicitly
            (first set wins); where none is set, botocore's own chain applies (``AWS_*``,
            ``AWS_PROFILE``, ``~/.aws``).
        addressing_style: botocore's ``s3.addressing_style``.
        checksums: botocore's ``request_checksum_calculation`` and
            ``response_checksum_validation``; ``None`` keeps botocore's default (and its
            ``AWS_REQUEST_CHECKSUM_CALCULATION`` variable).
        credentials_hint: the variables a user sets, named in errors.
    """

    name: str
    endpoint_env: tuple[str, ...]
    key_env: tuple[str, ...]
    secret_env: tuple[str, ...]
    token_env: tuple[str, ...]
    region_env: tuple[str, ...]
    addressing_style: Literal["auto", "virtual", "path"]
    checksums: Literal["when_required", "when_supported"] | None
    credentials_hint: str


# OSS accepts S3 requests only as virtual-hosted (bucket.endpoint), and rejects the CRC32
# checksum headers that botocore >= 1.36 adds to every upload by default
# (https://github.com/boto/boto3/issues/4400); "when_required" sends them only for the few
# operations that need one.
SCHEMES: dict[str, Scheme] = {
    "s3": Scheme(
        name="s3",
        endpoint_env=("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        key_env=(), secret_env=(), token_env=(), region_env=(),
        addressing_style="auto",
        checksums=None,
        credentials_hint="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
    ),
    "oss": Scheme(
        name="oss",
        endpoint_env=("OSS_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        key_env=("OSS_ACCESS_KEY_ID",),
        secret_env=("OSS_ACCESS_KEY_SECRET",),
        token_env=("OSS_SESSION_TOKEN",),
        region_env=("OSS_REGION",),
        addressing_style="virtual",
        checksums="when_required",
        credentials_hint="OSS_ACCESS_KEY_ID and OSS_ACCESS_KEY_SECRET (or AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)",
    ),
}

# Every variable whose value must never be shown (scrubbed from messages as a last resort).
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID",
               "OSS_ACCESS_KEY_SECRET", "OSS_SESSION_TOKEN", "OSS_ACCESS_KEY_ID")


@dataclass(frozen=True)
class StorageURL:
    """A parsed location: ``scheme`` is ``"file"`` for local paths (then ``key`` is the path)."""

    scheme: str
    bucket: str
    key: str
    url: str

    @property
    def is_remote(self) -> bool:
        return self.scheme != "file"

    @property
    def path(self) -> str:
        """What fsspec calls the path: ``bucket/key`` (remote) or the local path."""
        if not self.is_remote:
            return self.key
        return f"{self.bucket}/{self.key}" if self.key else self.bucket


@dataclass(frozen=True)
class RemoteFile:
    """One object under a prefix: its path relative to the prefix, its size and its ETag."""

    relpath: str
    size: int
    etag: str


# --------------------------------------------------------------------------- URLs


def parse_url(url: str | os.PathLike) -> StorageURL:
    """Split a local path, ``s3://bucket/key`` or ``oss://bucket/key``.

    Raises:
        StorageError: ``unsupported`` for another scheme, ``config`` for a URL without a
            bucket or with credentials in it.
    """
    text = os.fspath(url)
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", text)
    if not match:
        return StorageURL("file", "", text, text)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return StorageURL("file", "", rest, text)
    if scheme not in SCHEMES:
        raise StorageError(
            f"{text}: unsupported URL scheme {scheme + '://'!r}. Use a local path, s3://bucket/prefix "
            "or oss://bucket/prefix.", kind="unsupported", url=text)
    bucket, _, key = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        # fsspec would read s3://KEY:SECRET@bucket; credentials belong in the environment.
        raise StorageError(
            f"{scheme}://...@{bucket.rpartition('@')[2]}: credentials in a URL are not accepted. "
            f"Set {SCHEMES[scheme].credentials_hint} in the environment instead.", kind="config", url="")
    if not bucket:
        raise StorageError(f"{text}: no bucket in the URL. Write {scheme}://bucket/prefix.",
                           kind="config", url=text)
    return StorageURL(scheme, bucket, key.strip("/"), text)


def is_remote(url: str | os.PathLike | None) -> bool:
    """True for ``s3://`` and ``oss://`` (and other scheme) URLs, False for local paths and None."""
    return url is not None and bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", os.fspath(url))) \
        and not os.fspath(url).lower().startswith("file://")


def join(url: str | os.PathLike, *parts: str) -> str:
    """``url/part/...`` for URLs, ``os.path.join`` for local paths."""
    text = os.fspath(url)
    if not is_remote(text):
        return os.path.join(text, *parts)
    return "/".join([text.rstrip("/"), *(p.strip("/") for p in parts)])


# --------------------------------------------------------------------------- settings


def _first_env(names: tuple[str, ...]) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _limit(name: str, default: float, cast: type) -> Any:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        number = cast(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise StorageError(f"{name}={value!r} is not a positive {cast.__name__}. "
                           f"Unset it or set a positive number (default {default}).", kind="config")
    return number


def timeout_s() -> float:
    """Connect and read timeout of each request, from ``NPU_MIGRATE_STORAGE_TIMEOUT`` (seconds)."""
    return float(_limit(ENV_TIMEOUT, DEFAULT_TIMEOUT_S, float))


def attempts() -> int:
    """Attempts per request, from ``NPU_MIGRATE_STORAGE_RETRIES``: botocore retries with backoff."""
    return int(_limit(ENV_RETRIES, DEFAULT_ATTEMPTS, int))


def endpoint(scheme: str) -> str | None:
    """The endpoint URL for ``scheme`` from the environment (``https://`` added when missing)."""
    value = _first_env(SCHEMES[scheme].endpoint_env)
    if value and "://" not in value:
        value = "https://" + value  # OSS documents its endpoints as bare host names
    return value


def shown_endpoint(scheme: str) -> str:
    """The endpoint as errors show it: without any user:password part."""
    value = endpoint(scheme)
    if not value:
        return "the default AWS endpoint" if scheme == "s3" else "no endpoint (set OSS_ENDPOINT)"
    parts = urlsplit(value)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _oss_region(url: str | None) -> str | None:
    """``oss-cn-hangzhou`` from ``https://oss-cn-hangzhou[-internal].aliyuncs.com``."""
    host = urlsplit(url).hostname or "" if url else ""
    label = host.split(".")[0]
    if label.startswith("oss-"):
        return label[: -len("-internal")] if label.endswith("-internal") else label
    return None


def client_settings(scheme: str) -> dict[str, Any]:
    """The keyword arguments of ``s3fs.S3FileSystem`` for ``scheme``, from the environment.

    Secrets appear only in the returned dict (``key``, ``secret``, ``token``), which is handed
    to the client and never logged.
    """
    spec = SCHEMES[scheme]
    url = endpoint(scheme)
    if url is None and scheme != "s3":  # without one, botocore would send OSS requests to AWS
        raise StorageError(
            f"{scheme}:// needs an endpoint: set {spec.endpoint_env[0]} (for example "
            "oss-cn-hangzhou.aliyuncs.com, or its -internal name inside Alibaba Cloud).", kind="config")
    timeout, tries = timeout_s(), attempts()
    config: dict[str, Any] = {
        "connect_timeout": timeout,
        "read_timeout": timeout,
        "retries": {"total_max_attempts": tries, "mode": "standard"},
        "s3": {"addressing_style": spec.addressing_style},
    }
    if spec.checksums is not None and _botocore_has_checksum_options():
        config["request_checksum_calculation"] = spec.checksums
        config["response_checksum_validation"] = spec.checksums
    client: dict[str, Any] = {}
    region = _first_env(spec.region_env)
    if scheme == "oss":
        region = region or _first_env(("AWS_REGION", "AWS_DEFAULT_REGION")) or _oss_region(url)
    if region:
        client["region_name"] = region
    kwargs: dict[str, Any] = {"endpoint_url": url, "config_kwargs": config, "client_kwargs": client,
                              "skip_instance_cache": True}
    key, secret, token = _first_env(spec.key_env), _first_env(spec.secret_env), _first_env(spec.token_env)
    if key or secret:
        kwargs.update(key=key, secret=secret, token=token)
    return kwargs


def _botocore_has_checksum_options() -> bool:
    """botocore >= 1.36 knows ``request_checksum_calculation``; older ones send no checksums anyway."""
    from botocore.config import Config

    return "request_checksum_calculation" in getattr(Config, "OPTION_DEFAULTS", {})


_FILESYSTEMS: dict[tuple, Any] = {}
_FS_LOCK = threading.Lock()


def filesystem(url: str | StorageURL) -> Any:
    """The fsspec filesystem for a remote URL, configured from the environment.

    Raises:
        StorageError: ``not_installed`` (naming the extra) when fsspec or s3fs is missing.
    """
    parsed = url if isinstance(url, StorageURL) else parse_url(url)
    try:
        import s3fs
    except ImportError as exc:
        raise StorageError(
            f"{parsed.url}: {parsed.scheme}:// URLs need the storage extra (fsspec, s3fs), which is not "
            f"installed ({exc.name or 's3fs'} is missing). Install it: {EXTRA}", kind="not_installed",
            url=parsed.url) from None
    try:
        kwargs = client_settings(parsed.scheme)
    except StorageError as exc:
        raise StorageError(f"{parsed.url}: {exc}", kind=exc.kind, url=parsed.url) from None
    cache_key = (parsed.scheme, os.getpid(), repr(sorted(kwargs.items())))
    with _FS_LOCK:
        fs = _FILESYSTEMS.get(cache_key)
        if fs is None:
            fs = s3fs.S3FileSystem(**kwargs)
            # s3fs retries some errors itself on top of botocore's attempts: keep the total bounded.
            fs.retries = 1
            _FILESYSTEMS[cache_key] = fs
    return fs


# --------------------------------------------------------------------------- errors


def _scrub(text: str) -> str:
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return redact.text(text)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _error_code(exc: BaseException) -> str | None:
    for item in _chain(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
    return None


_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
           "TokenRefreshRequired", "403", "Forbidden", "InvalidSecurity", "AllAccessDisabled"}
_NETWORK_NAMES = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                  "ClientConnectorError", "ServerDisconnectedError", "ClientPayloadError", "IncompleteRead",
                  "ClientOSError", "ServerTimeoutError", "TimeoutError", "FSTimeoutError", "ProxyConnectionError",
                  "ConnectionError", "ResponseStreamingError", "timeout", "ConnectionRefusedError",
                  "ConnectionResetError", "gaierror"}


def _network_reason(exc: BaseException) -> str | None:
    for item in _chain(exc):
        names = {cls.__name__ for cls in type(item).__mro__}
        if names & _NETWORK_NAMES or isinstance(item, (socket.timeout, ConnectionError, socket.gaierror)):
            if names & {"ConnectTimeoutError", "ReadTimeoutError", "TimeoutError", "FSTimeoutError",
                        "ServerTimeoutError", "timeout"}:
                return "timed out"
            if names & {"ClientPayloadError", "IncompleteRead", "ConnectionClosedError", "ServerDisconnectedError",
                        "ConnectionResetError", "ResponseStreamingError"}:
                return "the connection broke off mid-transfer"
            if names & {"gaierror"} or "Name or service not known" in str(item):
                return "its host name does not resolve"
            return "connection refused or no route"
    return None


def translate(exc: BaseException, url: str | StorageURL) -> StorageError:
    """One :class:`StorageError` line for whatever the client raised about ``url``."""
    if isinstance(exc, StorageError):
        return exc
    parsed = url if isinstance(url, StorageURL) else parse_url(url)
    text = parsed.url
    if not parsed.is_remote:
        if isinstance(exc, FileNotFoundError):
            return StorageError(f"{text}: no such file. Check the path.", kind="missing_object", url=text)
        if isinstance(exc, PermissionError):
            return StorageError(f"{text}: permission denied. Check the file's permissions.",
                                kind="access_denied", url=text)
        return StorageError(f"{text}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}",
                            kind="other", url=text)
    spec = SCHEMES[parsed.scheme]
    where = shown_endpoint(parsed.scheme)
    endpoint_vars = " or ".join(spec.endpoint_env)
    code = _error_code(exc)
    names = {cls.__name__ for item in _chain(exc) for cls in type(item).__mro__}
    if code == "NoSuchBucket":
        return StorageError(
            f"{text}: bucket {parsed.bucket!r} does not exist at {where}. Check the bucket name and "
            f"{endpoint_vars}, or create the bucket.", kind="missing_bucket", url=text)
    if code in ("NoSuchKey", "404", "NotFound") or (code is None and isinstance(exc, FileNotFoundError)):
        return StorageError(f"{text}: no such object at {where}. Check the path, or upload the object first.",
                            kind="missing_object", url=text)
    if code in _DENIED or isinstance(exc, PermissionError):
        return StorageError(
            f"{text}: access denied ({_shown_code(code)}) by {where}. Check {spec.credentials_hint}: "
            "the key id, its secret, and the key's permissions on the bucket.", kind="access_denied", url=text)
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        return StorageError(f"{text}: no credentials found. Set {spec.credentials_hint}.",
                            kind="no_credentials", url=text)
    reason = _network_reason(exc)
    if reason is not None:
        return StorageError(
            f"{text}: cannot reach {where} ({reason}) after {attempts()} attempt(s) of at most {timeout_s():g} s. "
            f"Check {endpoint_vars} and the network; {ENV_TIMEOUT} and {ENV_RETRIES} set the limits.",
            kind="unreachable", url=text)
    detail = _scrub(" ".join(str(exc).split()))[:200]
    return StorageError(f"{text}: {code or type(exc).__name__} from {where}: {detail}", kind="other", url=text)


def _shown_code(code: str | None) -> str:
    """``InvalidAccessKeyId`` as it is; ``HTTP 403`` for a bare status (HEAD answers have no body)."""
    if code is None:
        return "forbidden"
    return f"HTTP {code}" if code.isdigit() else code


def _missing(fs: Any, parsed: StorageURL, exc: BaseException) -> StorageError:
    """Tell a missing bucket from a missing object when the client did not say which."""
    error = translate(exc, parsed)
    if error.kind == "missing_object":
        try:
            fs.ls(parsed.bucket, refresh=True)
        except Exception as again:  # noqa: BLE001 - whatever the bucket check says is the better answer
            better = translate(again, parsed)
            if better.kind != "missing_object":
                return better
            return translate(_NoSuchBucket(), parsed)
    return error


class _NoSuchBucket(Exception):
    response = {"Error": {"Code": "NoSuchBucket"}}


# --------------------------------------------------------------------------- operations


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
        raise _missing(fs, parsed, exc) from None
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
        raise _missing(fs, parsed, exc) from None
    body = response["Body"]
    try:
        if etag is not None and normalize_etag(response.get("ETag", "")) != etag:
            raise StorageError(f"{parsed.url}: the object changed while it was being downloaded. Run again.",
                               kind="incomplete", url=parsed.url)
        while True:
            try:
                piece = sync(fs.loop, body.read, block)
            except Exception as exc:  # noqa: BLE001
                raise translate(exc, parsed) from None
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
            raise translate(exc, parsed) from None
    fs = filesystem(parsed)
    try:
        return fs.cat_file(parsed.path)
    except Exception as exc:  # noqa: BLE001
        raise _missing(fs, parsed, exc) from None


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
        raise error from None


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
            raise translate(exc, parsed) from None
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
        raise error from None
