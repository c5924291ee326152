"""The S3 client behind remote URLs: its settings from the environment, one fsspec filesystem per process.

Usage::

    from npu_migrate.data import client

    client.client_settings("oss")       # s3fs.S3FileSystem's keyword arguments (secrets included: never log them)
    fs = client.filesystem("s3://bucket/prefix")
    client.timeout_s(), client.attempts()   # NPU_MIGRATE_STORAGE_TIMEOUT, NPU_MIGRATE_STORAGE_RETRIES

fsspec and s3fs (the ``storage`` extra) are imported on the first remote URL only.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from npu_migrate.data.urls import SCHEMES, StorageURL, parse_url
from npu_migrate.errors import StorageError

EXTRA = "pip install 'npu-migrate[storage]'"
ENV_TIMEOUT = "NPU_MIGRATE_STORAGE_TIMEOUT"
ENV_RETRIES = "NPU_MIGRATE_STORAGE_RETRIES"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_ATTEMPTS = 3


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
            url=parsed.url) from exc
    try:
        kwargs = client_settings(parsed.scheme)
    except StorageError as exc:
        raise StorageError(f"{parsed.url}: {exc}", kind=exc.kind, url=parsed.url) from exc
    cache_key = (parsed.scheme, os.getpid(), repr(sorted(kwargs.items())))
    with _FS_LOCK:
        fs = _FILESYSTEMS.get(cache_key)
        if fs is None:
            fs = s3fs.S3FileSystem(**kwargs)
            # s3fs retries some errors itself on top of botocore's attempts: keep the total bounded.
            fs.retries = 1
            _FILESYSTEMS[cache_key] = fs
    return fs
