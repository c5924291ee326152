"""Whether a cached file holds the bytes of the object it was downloaded from, and when to ask.

Usage::

    from npu_migrate.data import verify

    if verify.is_shared(cache_root, path):                # someone else could have swapped it
        ok = verify.matches_etag(path, item.etag, item.size)   # True, False, or None (cannot tell)

A private cache (every directory from the cache root down to the file, and the file, owned by
this user or root and writable by no one else) is trusted on its record: the ETag and size it
was verified against when it was downloaded. In a **shared** cache anyone with write access could
swap a file for other bytes of the same size (and rewrite its record), so the bytes themselves
are hashed and checked against the ETag of the listing before the file is served:

* a single-part upload's ETag is the MD5 of its bytes (S3, OSS, MinIO, OBS);
* a multipart upload's ETag (``HEX-N``) is the MD5 of the N parts' MD5s. The part size is not in
  the listing, so the sizes upload tools use are tried (whole MiB: aws-cli and boto3 8 MiB, s3fs
  50 MiB, rclone 5 MiB, MinIO 16 or 64 MiB..., then the smallest whole MiB), each that gives N
  parts, at most :data:`MAX_CANDIDATES` of them;
* anything else (an ETag that is not an MD5, or no part size that reproduces it): ``None``,
  and the caller downloads the file again rather than trust it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

MIB = 2**20
_READ = 4 * MIB


def _writable_by_others(st: os.stat_result) -> bool:
    return st.st_uid not in (os.getuid(), 0) or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def is_shared(root: Path, path: Path) -> bool:
    """True when anyone but this user (and root) could have changed ``path`` since it was verified.

    Looks at ``path`` and every directory from its parent up to ``root`` inclusive.
    """
    try:
        if _writable_by_others(os.lstat(path)):
            return True
        real_root = os.path.realpath(root)
        current = os.path.dirname(os.path.abspath(path))
        while True:
            if _writable_by_others(os.stat(current)):
                return True
            if os.path.realpath(current) == real_root or os.path.dirname(current) == current:
                return False
            current = os.path.dirname(current)
    except OSError:
        return True


def is_md5(etag: str) -> bool:
    """A plain MD5 ETag (single-part upload), normalised to lower case."""
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag)


def _multipart(etag: str) -> tuple[str, int] | None:
    digest, dash, count = etag.partition("-")
    if dash and is_md5(digest) and count.isdigit() and int(count) > 0:
        return digest, int(count)
    return None


COMMON_PART_MIB = (8, 5, 16, 50, 64, 10, 15, 32, 100, 128, 256, 512)
"""Part sizes of common upload tools, tried first: aws-cli/boto3 8, rclone 5, MinIO 16/64, s3fs 50..."""
MAX_CANDIDATES = 8  # bounded work: a few full reads of the file at most


def part_size_candidates(size: int, parts: int) -> list[int]:
    """Part sizes that split ``size`` bytes into ``parts`` parts: common sizes, then whole MiB."""
    if parts == 1:
        return [size]
    low, high = -(-size // parts), (size - 1) // (parts - 1)  # ceil(size / p) == parts for p in [low, high]
    found = [mib * MIB for mib in COMMON_PART_MIB if low <= mib * MIB <= high]
    mib = -(-low // MIB)  # then the smallest whole MiB that fits (tools that size parts to a part limit)
    while mib * MIB <= high and len(found) < MAX_CANDIDATES:
        if mib * MIB not in found:
            found.append(mib * MIB)
        mib += 1
    return found[:MAX_CANDIDATES]


def multipart_etag(path: Path, part_size: int) -> str:
    """S3's ETag of ``path`` uploaded in parts of ``part_size`` bytes: ``md5(md5(p1) + md5(p2)...)-N``."""
    digests = []
    with open(path, "rb") as fh:
        while True:
            part, left = hashlib.md5(), part_size  # noqa: S324 - S3's ETag is defined with MD5
            while left:
                block = fh.read(min(_READ, left))
                if not block:
                    break
                part.update(block)
                left -= len(block)
            if left == part_size:
                break
            digests.append(part.digest())
            if left:
                break
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"  # noqa: S324


def md5_of(path: Path) -> str:
    digest = hashlib.md5()  # noqa: S324 - S3's ETag of a single-part upload is the MD5
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_READ), b""):
            digest.update(block)
    return digest.hexdigest()


def matches_etag(path: Path, etag: str, size: int) -> bool | None:
    """Whether the bytes of ``path`` are those of an object with ``etag`` and ``size``.

    Returns:
        True or False when the ETag can be recomputed from the bytes, ``None`` when it cannot.
    """
    try:
        if os.path.getsize(path) != size:
            return False
        if is_md5(etag):
            return md5_of(path) == etag
        multipart = _multipart(etag)
        if multipart is None:
            return None
        for part_size in part_size_candidates(size, multipart[1]):
            if multipart_etag(path, part_size) == etag:
                return True
        return None
    except OSError:
        return False
