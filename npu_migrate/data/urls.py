"""Storage URLs: the schemes npu_migrate reads and writes (local, ``s3://``, ``oss://``) and their parsing.

Usage::

    from npu_migrate.data.urls import SCHEMES, parse_url

    parse_url("oss://bucket/mnist")         # StorageURL(scheme='oss', bucket='bucket', key='mnist', ...)
    SCHEMES["oss"].endpoint_env             # ('OSS_ENDPOINT', 'AWS_ENDPOINT_URL_S3', 'AWS_ENDPOINT_URL')

A :class:`Scheme` row says which environment variables configure a scheme's client (read by
:mod:`npu_migrate.data.client`); credentials never come from a URL. The operations on URLs are
:mod:`npu_migrate.data.storage`'s.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from npu_migrate.errors import StorageError


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
