"""What a storage failure becomes: one :class:`~npu_migrate.errors.StorageError` line, never a credential.

Usage::

    from npu_migrate.data.failures import translate

    try:
        fs.cat_file(parsed.path)
    except Exception as exc:
        raise translate(exc, parsed) from None   # "s3://b/k: access denied (InvalidAccessKeyId) by ..."

The error's ``kind`` (``missing_bucket``, ``missing_object``, ``access_denied``, ``no_credentials``,
``unreachable``, ``other``) comes from the client's error code or the exception's class, through
its ``__cause__``/``__context__`` chain; messages are scrubbed of every credential value in the
environment.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Iterator

from npu_migrate import redact
from npu_migrate.data.client import ENV_RETRIES, ENV_TIMEOUT, attempts, shown_endpoint, timeout_s
from npu_migrate.data.urls import _SECRET_ENV, SCHEMES, StorageURL, parse_url
from npu_migrate.errors import StorageError


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
