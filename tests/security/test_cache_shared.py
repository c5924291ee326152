"""A shared cache serves only bytes that hash to the object's ETag (moto's S3 server on loopback).

Someone with write access to a shared cache directory swaps a cached file for other bytes of
the same size, in place, and leaves its record alone: a size check (all there was before) would
serve those bytes. The cache must hash them against the listing's ETag, single-part (MD5) and
multipart (MD5 of the parts' MD5s) alike, download the object again and serve the right bytes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from conftest import new_bucket

pytest.importorskip("s3fs", reason="the storage extra (fsspec, s3fs) is not installed")
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is not installed")

from npu_migrate.data import cache, storage  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")  # conftest's fixtures: s3 and server (moto on 127.0.0.1)

MIB = 2**20


def swap_in_place(path: Path) -> None:
    """Overwrite every byte of ``path`` without changing its size, inode, or record."""
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.write(b"\x00" * size)
    assert path.stat().st_size == size


def share(directory: Path) -> None:
    """A cache directory the whole group (here: everyone) may write in, as a team cache is."""
    for path in [directory, *directory.rglob("*")]:
        if path.is_dir():
            path.chmod(0o777)


def multipart_upload(bucket: str, key: str, data: bytes, part: int) -> str:
    from fsspec.asyn import sync

    fs = storage.filesystem(f"s3://{bucket}")
    call = lambda op, **kw: sync(fs.loop, fs._call_s3, op, Bucket=bucket, Key=key, **kw)  # noqa: E731
    upload_id = call("create_multipart_upload")["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(data), part), 1):
        answer = call("upload_part", UploadId=upload_id, PartNumber=number, Body=data[start:start + part])
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
    return call("complete_multipart_upload", UploadId=upload_id, MultipartUpload={"Parts": parts})["ETag"]


@pytest.mark.parametrize("multipart", [False, True], ids=["md5-etag", "multipart-etag"])
def test_swapped_file_in_a_shared_cache_is_downloaded_again(s3, tmp_path: Path, caplog,
                                                            multipart: bool) -> None:
    bucket = new_bucket("shared")
    data = os.urandom(11 * MIB if multipart else 300_000)
    if multipart:
        etag = multipart_upload(bucket, "d/blob.bin", data, part=5 * MIB)
        assert etag.strip('"').endswith("-3")
    else:
        storage.write_bytes_atomic(f"s3://{bucket}/d/blob.bin", data)
    cache_dir = tmp_path / "team-cache"
    root = cache.fetch(f"s3://{bucket}/d", cache_dir=cache_dir, progress=lambda n: None)
    assert (root / "blob.bin").read_bytes() == data
    share(cache_dir)

    swap_in_place(root / "blob.bin")
    caplog.set_level(logging.WARNING, logger="npu_migrate.data.cache")
    again = cache.fetch(f"s3://{bucket}/d", cache_dir=cache_dir, progress=lambda n: None)

    assert (again / "blob.bin").read_bytes() == data
    assert any("does not hold the bytes of the object" in r.getMessage() for r in caplog.records), caplog.text

    s3.record()  # the fresh copy hashes to the ETag (multipart too): served with no download
    cache.fetch(f"s3://{bucket}/d", cache_dir=cache_dir, progress=lambda n: None)
    assert [r for r in s3.recorded() if r["method"] == "GET" and "list-type" not in r["url"]] == []


def test_intact_file_in_a_shared_cache_is_served_without_a_download(s3, tmp_path: Path) -> None:
    bucket = new_bucket("intact")
    data = os.urandom(200_000)
    storage.write_bytes_atomic(f"s3://{bucket}/d/f.bin", data)
    cache_dir = tmp_path / "team-cache"
    cache.fetch(f"s3://{bucket}/d", cache_dir=cache_dir, progress=lambda n: None)
    share(cache_dir)
    s3.record()
    root = cache.fetch(f"s3://{bucket}/d", cache_dir=cache_dir, progress=lambda n: None)
    gets = [r for r in s3.recorded() if r["method"] == "GET" and "list-type" not in r["url"]]
    assert gets == [] and (root / "f.bin").read_bytes() == data
