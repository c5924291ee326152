"""The data cache writes only inside itself: hostile object keys and URLs against moto's S3 server on loopback.

Each object is put with boto3 under the exact key an attacker would choose (S3 keys are opaque
names: ``..``, ``//`` and ``\\`` are all valid in them), and ``cache.fetch`` is run as a user
would. The tests then walk the whole temporary directory: nothing may exist outside the cache.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conftest import new_bucket

pytest.importorskip("s3fs", reason="the storage extra (fsspec, s3fs) is not installed")
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is not installed")

from npu_migrate.data import cache, storage  # noqa: E402
from npu_migrate.errors import StorageError  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")  # conftest's fixtures: s3 and server (moto on 127.0.0.1)

PAYLOAD = b"import os; os.system('echo owned')\n"


def put(bucket: str, key: str, data: bytes) -> None:
    """One object under exactly ``key`` (no client-side path handling on the way)."""
    from fsspec.asyn import sync

    fs = storage.filesystem(f"s3://{bucket}")
    sync(fs.loop, fs._call_s3, "put_object", Bucket=bucket, Key=key, Body=data)


def files_outside(top: Path, cache_dir: Path) -> list[str]:
    return sorted(str(p) for p in top.rglob("*") if not p.is_dir() and cache_dir not in p.parents)


def test_traversal_keys_are_skipped_with_one_warning_each(s3, tmp_path: Path, caplog) -> None:
    home = tmp_path / "home"
    cache_dir = home / ".cache" / "npu_migrate"
    bucket = new_bucket("trav")
    # ``prefix//abs/path`` with an absolute path under tmp_path, so that the unfixed code, which
    # wrote there, cannot touch the machine's real /abs
    hostile = ["prefix/../../../../X", "prefix/../../../../../../.bashrc", f"prefix/{tmp_path / 'abs' / 'path'}",
               f"prefix/{tmp_path / 'abs2.pth'}", "prefix/a\\..\\..\\b", "prefix/./dot",
               "prefix/.ok.txt.json"]
    for key in hostile:
        put(bucket, key, PAYLOAD)
    put(bucket, "prefix/ok.txt", b"fine")
    caplog.set_level(logging.WARNING, logger="npu_migrate.data.cache")

    root = cache.fetch(f"s3://{bucket}/prefix", cache_dir=cache_dir, progress=lambda n: None)

    assert (root / "ok.txt").read_bytes() == b"fine"
    assert files_outside(tmp_path, cache_dir) == []
    assert not (tmp_path / "abs").exists() and not (tmp_path / "abs2.pth").exists()
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == [".ok.txt.json", "ok.txt"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(hostile), warnings
    for key, line in zip(sorted(k[len("prefix/"):] for k in hostile), sorted(warnings)):
        assert f"skipped the object {key!r}" in line, (key, line)
        assert "\n" not in line


def test_url_with_dot_dot_or_empty_segments_is_refused(s3, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    bucket = new_bucket("urls")
    put(bucket, "x/f", PAYLOAD)
    for url in (f"s3://{bucket}/../../x", f"s3://{bucket}/a/../../../x", f"s3://{bucket}//x",
                f"s3://{bucket}/a\\..\\x", "s3://../x"):
        with pytest.raises(StorageError, match=r"so its copy would not stay inside the cache directory") as exc:
            cache.fetch(url, cache_dir=cache_dir)
        assert exc.value.kind == "config"
    assert files_outside(tmp_path, cache_dir) == []
    assert not (tmp_path / "x").exists()


def test_symlink_inside_the_cache_pointing_out_is_not_followed(s3, tmp_path: Path) -> None:
    cache_dir, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    elsewhere.mkdir()
    bucket = new_bucket("link")
    put(bucket, "d/sub/evil.pth", PAYLOAD)
    put(bucket, "d/top.bin", b"top")
    target = cache.local_dir(f"s3://{bucket}/d", cache_dir)
    target.mkdir(parents=True)
    (target / "sub").symlink_to(elsewhere)  # planted by whoever else can write in a shared cache
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (target / "top.bin").symlink_to(victim)  # a link at a file's own name: replaced, never written through

    with pytest.raises(StorageError, match=r"outside the cache directory .*nothing was written") as exc:
        cache.fetch(f"s3://{bucket}/d", cache_dir=cache_dir)
    assert exc.value.kind == "config"
    assert list(elsewhere.iterdir()) == []
    assert victim.read_text() == "mine"

    (target / "sub").unlink()
    root = cache.fetch(f"s3://{bucket}/d", cache_dir=cache_dir)
    assert victim.read_text() == "mine" and not (root / "top.bin").is_symlink()
    assert (root / "top.bin").read_bytes() == b"top" and (root / "sub" / "evil.pth").read_bytes() == PAYLOAD
