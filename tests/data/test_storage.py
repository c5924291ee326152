"""Data and checkpoints in object storage, against a real S3 server on loopback (moto's server mode).

Nothing here mocks boto, botocore or s3fs: the tests start moto's ``ThreadedMotoServer`` on
127.0.0.1 (and, where it must die mid-transfer, one in its own process) and talk to it through the
real clients. What the server received is read back from moto's request recorder. OSS's
virtual-hosted requests (``bucket.endpoint``) reach the same server as an HTTP proxy, so no name
is ever resolved and nothing leaves loopback.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conftest import DATA_SCRIPTS, KEY_ID, ROOT, SECRET, Server, child_env, free_port, new_bucket, oss_env, s3_env
from support import EXAMPLES, check_rows, load_example, ok, rows, write_idx

pytest.importorskip("s3fs", reason="the storage extra (fsspec, s3fs) is not installed")
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is not installed")

from npu_migrate.data import cache, storage  # noqa: E402
from npu_migrate.errors import StorageError  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")  # conftest's: no credentials or proxies of the host


def upload(url: str, data: bytes) -> None:
    storage.write_bytes_atomic(url, data)


# --------------------------------------------------------------------------- MNIST files


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits written as torchvision's MNIST files (1438 training, 359 test images)."""
    import numpy as np

    mnist = load_example("mnist")
    train, test = mnist.load_digits()
    root = tmp_path_factory.mktemp("mnist")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, data in (("train", train), ("t10k", test)):
        images, labels = data.tensors
        pixels = ((images * mnist.STD + mnist.MEAN) * 255).round().clamp(0, 255).squeeze(1).numpy().astype(np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", pixels)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels.numpy().astype(np.uint8))
    return root


def upload_dir(local: Path, url: str) -> list[str]:
    names = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    for name in names:
        upload(f"{url}/{name}", (local / name).read_bytes())
    return names


def run(tmp: Path, example: str, *args: str, nproc: int = 2, env: dict[str, str] | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess:
    """An example through the launcher on ``nproc`` ranks (``nproc=0``: one plain process)."""
    script = str(EXAMPLES / example)
    cmd = [sys.executable, script] if nproc == 0 else \
        [sys.executable, "-m", "npu_migrate.launch", "--device-num", str(nproc), script]
    return subprocess.run([*cmd, *args], env=child_env(**(env or {})), cwd=tmp, capture_output=True, text=True,
                          timeout=timeout)


def gets(recorded: list[dict]) -> list[str]:
    """The paths of the GET requests for objects (not listings) the server received."""
    return [urlsplit(r["url"]).path for r in recorded if r["method"] == "GET" and "list-type" not in r["url"]]


# --------------------------------------------------------------------------- the examples


MNIST_ARGS = ["--epochs", "1", "--limit-batches", "4"]


@pytest.mark.long
def test_mnist_from_s3_on_2_ranks_matches_local_copy_and_downloads_once_per_node(
        s3: Server, mnist_dir: Path, tmp_path: Path) -> None:
    bucket = new_bucket("mnist")
    names = upload_dir(mnist_dir, f"s3://{bucket}/datasets")
    env = s3_env(s3)

    ok(run(tmp_path, "mnist.py", *MNIST_ARGS, "--data-dir", str(mnist_dir), "--metrics", "local.jsonl", env=env))
    s3.record()
    remote = ["--data-dir", f"s3://{bucket}/datasets", "--cache-dir", str(tmp_path / "cache")]
    result = ok(run(tmp_path, "mnist.py", *MNIST_ARGS, *remote, "--metrics", "s3.jsonl", env=env))
    first = s3.recorded()

    local, from_s3 = rows(tmp_path / "local.jsonl"), rows(tmp_path / "s3.jsonl")
    check_rows(from_s3, [1])
    for key in ("train_loss", "test_loss", "test_correct", "test_samples", "samples"):
        assert from_s3[0][key] == local[0][key], (key, from_s3, local)
    assert "MNIST: 1438 training and 359 held-out samples" in result.stderr
    # two ranks, one node: every object fetched exactly once (each is smaller than a chunk), one listing
    assert sorted(gets(first)) == sorted(f"/{bucket}/datasets/{name}" for name in names), gets(first)
    assert sum("list-type" in r["url"] for r in first) == 1
    copy = tmp_path / "cache" / "s3" / bucket / "datasets"
    for name in names:
        assert (copy / name).read_bytes() == (mnist_dir / name).read_bytes()
    assert not list(copy.rglob("*.part"))

    s3.record()  # the next fetch uses the cache: a listing, no object downloaded again
    assert cache.fetch(f"s3://{bucket}/datasets", include=load_example("mnist").REMOTE_FILES,
                       cache_dir=tmp_path / "cache") == copy
    again = s3.recorded()
    assert gets(again) == [] and sum("list-type" in r["url"] for r in again) == 1


@pytest.mark.long
def test_seed000_tensors_from_oss_with_checkpoint(server: Server, mnist_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 000's training.pt / test.pt in oss://, OSS_* variables only, virtual-hosted, no checksum headers."""
    import torch

    mnist = load_example("mnist")
    train, test = mnist.load_digits()
    seed000 = tmp_path / "seed000"
    seed000.mkdir()
    for name, data in (("training.pt", train), ("test.pt", test)):
        images, labels = data.tensors
        pixels = ((images * mnist.STD + mnist.MEAN) * 255).round().clamp(0, 255).squeeze(1).to(torch.uint8)
        torch.save((pixels, labels), seed000 / name)
    for name, value in oss_env(server).items():
        monkeypatch.setenv(name, value)
    bucket = new_bucket("oss", scheme="oss")  # created through the OSS settings themselves
    upload_dir(seed000, f"oss://{bucket}/mnist")
    env = oss_env(server)

    ok(run(tmp_path, "mnist.py", "--dry-run", "--data-dir", str(seed000), "--metrics", "local.jsonl", nproc=0,
           env=env))
    server.record()
    result = ok(run(tmp_path, "mnist.py", "--dry-run", "--data-dir", f"oss://{bucket}/mnist",
                    "--cache-dir", str(tmp_path / "cache"), "--checkpoint-dir", f"oss://{bucket}/run1",
                    "--metrics", "oss.jsonl", nproc=0, env=env))
    recorded = server.recorded()
    assert "MNIST: 1438 training and 359 held-out samples" in result.stderr
    assert rows(tmp_path / "oss.jsonl")[0]["test_loss"] == rows(tmp_path / "local.jsonl")[0]["test_loss"]

    hosts = {r["headers"].get("Host", "").split(":")[0] for r in recorded}
    assert hosts == {f"{bucket}.oss-test-1.example.invalid"}, hosts  # virtual-hosted, every request
    puts = [r for r in recorded if r["method"] == "PUT"]
    assert [p["url"].split("?")[0] for p in puts] == [f"http://{bucket}.oss-test-1.example.invalid:{server.port}/run1/last.pt"]
    sent = {name.lower() for name in puts[0]["headers"]}
    assert not {h for h in sent if h.startswith(("x-amz-checksum", "x-amz-sdk-checksum"))}, sent
    checkpoint = torch.load(io.BytesIO(storage.read_bytes(f"oss://{bucket}/run1/last.pt")), weights_only=True)
    assert checkpoint["epoch"] == 1
    assert SECRET not in result.stderr + result.stdout and KEY_ID not in result.stderr + result.stdout


@pytest.mark.long
def test_checkpoint_in_s3_resumes_to_the_uninterrupted_run(s3: Server, mnist_dir: Path, tmp_path: Path) -> None:
    bucket = new_bucket("ckpt")
    env = s3_env(s3)
    resume_args = ["--data-dir", str(mnist_dir), "--limit-batches", "3"]  # local data: only the checkpoint is remote
    ok(run(tmp_path, "mnist.py", *resume_args, "--epochs", "2", "--metrics", "full.jsonl", env=env))
    stopped = [*resume_args, "--checkpoint-dir", f"s3://{bucket}/runs/a", "--metrics", "resumed.jsonl"]
    s3.record()
    ok(run(tmp_path, "mnist.py", *stopped, "--epochs", "1", env=env))
    puts = [r for r in s3.recorded() if r["method"] == "PUT"]
    assert [urlsplit(p["url"]).path for p in puts] == [f"/{bucket}/runs/a/last.pt"]  # one whole upload per save
    result = ok(run(tmp_path, "mnist.py", *stopped, "--epochs", "2", "--resume", env=env))
    assert f"resumed from s3://{bucket}/runs/a/last.pt after epoch 1" in result.stderr
    full, resumed = rows(tmp_path / "full.jsonl"), rows(tmp_path / "resumed.jsonl")
    check_rows(resumed, [1, 2])
    assert [r["test_loss"] for r in resumed] == [r["test_loss"] for r in full]  # bit for bit on CPU
    assert [r["train_loss"] for r in resumed] == [r["train_loss"] for r in full]
    assert storage.parse_url(f"s3://{bucket}/runs/a/last.pt").key == "runs/a/last.pt"
    assert not [f for f in storage.list_files(f"s3://{bucket}/runs") if f.relpath != "a/last.pt"]


@pytest.mark.slow
def test_missing_bucket_stops_every_rank_with_one_line(s3: Server, tmp_path: Path) -> None:
    result = run(tmp_path, "mnist.py", "--dry-run", "--data-dir", "s3://no-such-bucket/datasets",
                 "--cache-dir", str(tmp_path / "cache"), env=s3_env(s3), timeout=120)
    assert result.returncode == 1
    # One line, from rank 0, behind the launcher's rank prefix (on by default for 2 ranks).
    errors = [line for line in result.stderr.splitlines() if "error: " in line and "npu-migrate launch" not in line]
    assert errors == [f"[{socket.gethostname()} node0 rank0] error: s3://no-such-bucket/datasets: bucket 'no-such-bucket' does not exist at "
                      f"{s3.endpoint}. Check the bucket name and AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, "
                      "or create the bucket."], result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr


@pytest.mark.slow
def test_checkpoint_bucket_is_checked_before_training(s3: Server, tmp_path: Path) -> None:
    result = run(tmp_path, "regression.py", "--dry-run", "--checkpoint-dir", "s3://no-such-bucket/run",
                 nproc=0, env=s3_env(s3))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: s3://no-such-bucket/run/last.pt: bucket 'no-such-bucket' does not exist"), result.stderr
    assert "epoch 1/" not in result.stderr


@pytest.mark.slow
def test_remote_data_dir_without_the_dataset_says_what_to_upload(s3: Server, tmp_path: Path) -> None:
    bucket = new_bucket("empty")
    upload(f"s3://{bucket}/datasets/README", b"nothing here")
    result = run(tmp_path, "mnist.py", "--dry-run", "--data-dir", f"s3://{bucket}/datasets",
                 "--cache-dir", str(tmp_path / "cache"), nproc=0, env=s3_env(s3))
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: s3://{bucket}/datasets: no objects matching MNIST/raw/*"), line
    assert "Upload the data there" in line


# --------------------------------------------------------------------------- each error, in one line


def test_missing_bucket_and_object(s3: Server, tmp_path: Path) -> None:
    bucket = new_bucket()
    with pytest.raises(StorageError, match=r"^s3://nope-bucket/x\.pt: bucket 'nope-bucket' does not exist at "
                                           r"http://127\.0\.0\.1:\d+\. Check the bucket name .* or create the bucket\.$") as exc:
        storage.read_bytes("s3://nope-bucket/x.pt")
    assert exc.value.kind == "missing_bucket"
    with pytest.raises(StorageError, match=rf"^s3://{bucket}/x\.pt: no such object at .*Check the path, or upload") as exc:
        storage.read_bytes(f"s3://{bucket}/x.pt")
    assert exc.value.kind == "missing_object"
    with pytest.raises(StorageError, match="bucket 'nope-bucket' does not exist") as exc:
        storage.write_bytes_atomic("s3://nope-bucket/run/last.pt", b"x")
    with pytest.raises(StorageError, match="bucket 'nope-bucket' does not exist"):
        cache.fetch("s3://nope-bucket/data", cache_dir=tmp_path)
    with pytest.raises(StorageError, match=r"^/no/such/file\.pt: no such file\. Check the path\.$"):
        storage.read_bytes("/no/such/file.pt")


def test_bad_credentials(s3: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = new_bucket()
    upload(f"s3://{bucket}/x.pt", b"data")
    s3.api("reset-auth", b"0")  # from now on moto checks every signature against its IAM users
    try:
        storage._FILESYSTEMS.clear()
        with pytest.raises(StorageError) as exc:
            storage.read_bytes(f"s3://{bucket}/x.pt")
    finally:
        s3.api("reset-auth", b"inf")
    message = str(exc.value)
    assert exc.value.kind == "access_denied"
    assert re.match(rf"s3://{bucket}/x\.pt: access denied \((InvalidAccessKeyId|HTTP 403)\) by {s3.endpoint}\. "
                    r"Check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE: ", message), message
    assert SECRET not in message and KEY_ID not in message and "\n" not in message


def test_no_credentials(s3: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probe off loopback
    with pytest.raises(StorageError, match=r"^s3://b/x: no credentials found\. Set AWS_ACCESS_KEY_ID") as exc:
        storage.read_bytes("s3://b/x")
    assert exc.value.kind == "no_credentials"


def test_unreachable_endpoint_bounded(s3: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    monkeypatch.setenv("NPU_MIGRATE_STORAGE_TIMEOUT", "2")
    monkeypatch.setenv("NPU_MIGRATE_STORAGE_RETRIES", "2")
    with pytest.raises(StorageError) as exc:
        storage.read_bytes("s3://bkt/x.pt")
    assert exc.value.kind == "unreachable"
    assert str(exc.value) == (
        f"s3://bkt/x.pt: cannot reach {closed} (connection refused or no route) after 2 attempt(s) of at most 2 s. "
        "Check AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL and the network; NPU_MIGRATE_STORAGE_TIMEOUT and "
        "NPU_MIGRATE_STORAGE_RETRIES set the limits.")
    monkeypatch.setenv("NPU_MIGRATE_STORAGE_RETRIES", "many")
    with pytest.raises(StorageError, match=r"^s3://bkt/x\.pt: NPU_MIGRATE_STORAGE_RETRIES='many' is not a positive int"):
        storage.read_bytes("s3://bkt/x.pt")


def test_fetch_in_a_job_needs_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(StorageError, match=r"^s3://bkt/data: in a job of 2 processes, call fetch\(\) after the "
                                           r"process group is initialised"):
        cache.fetch("s3://bkt/data")


def test_scheme_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # what `import s3fs` meets when it is not installed
    with pytest.raises(StorageError, match=r"^oss://bkt/data: oss:// URLs need the storage extra \(fsspec, s3fs\), "
                                           r"which is not installed .* pip install 'npu-migrate\[storage\]'$") as exc:
        cache.fetch("oss://bkt/data")
    assert exc.value.kind == "not_installed"


@pytest.mark.parametrize("url, message", [
    ("gs://bkt/data", r"^gs://bkt/data: unsupported URL scheme 'gs://'\. Use a local path, s3://bucket/prefix"),
    ("s3://AKIA:topsecret@bkt/data", r"^s3://\.\.\.@bkt: credentials in a URL are not accepted\. Set AWS_ACCESS_KEY_ID"),
    ("oss:///data", r"^oss:///data: no bucket in the URL\. Write oss://bucket/prefix\.$"),
])
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(StorageError, match=message) as exc:
        storage.parse_url(url)
    assert "topsecret" not in str(exc.value)


def test_oss_settings_come_from_oss_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSS_ENDPOINT", "oss-cn-hangzhou-internal.aliyuncs.com")
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", SECRET)
    settings = storage.client_settings("oss")
    assert settings["endpoint_url"] == "https://oss-cn-hangzhou-internal.aliyuncs.com"
    assert settings["client_kwargs"] == {"region_name": "oss-cn-hangzhou"}
    assert (settings["key"], settings["secret"]) == (KEY_ID, SECRET)
    assert settings["config_kwargs"]["s3"] == {"addressing_style": "virtual"}
    if storage._botocore_has_checksum_options():
        assert settings["config_kwargs"]["request_checksum_calculation"] == "when_required"
        assert settings["config_kwargs"]["response_checksum_validation"] == "when_required"
    assert "key" not in storage.client_settings("s3")  # s3:// leaves credentials to botocore's chain
    monkeypatch.delenv("OSS_ENDPOINT")
    with pytest.raises(StorageError, match=r"^oss://bkt/d: oss:// needs an endpoint: set OSS_ENDPOINT \(for example"):
        storage.read_bytes("oss://bkt/d")  # never AWS's default endpoint


# --------------------------------------------------------------------------- interrupted downloads


class KilledServer:
    """moto in its own process, so the test can SIGKILL it in the middle of a download."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(DATA_SCRIPTS / "moto_server.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
        line = self.proc.stdout.readline()
        assert line.startswith("PORT "), line
        self.endpoint = f"http://127.0.0.1:{int(line.split()[1])}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.mark.slow
def test_server_killed_mid_download_then_resumed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in s3_env(Server(0)).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NPU_MIGRATE_STORAGE_TIMEOUT", "5")
    monkeypatch.setenv("NPU_MIGRATE_STORAGE_RETRIES", "2")
    # far more than loopback's socket buffers can hold, so the kill cuts the stream short
    payload = os.urandom(24_000_000)
    url = "s3://data/sets/blob.bin"
    chunk = 64 * 1024

    first = KilledServer()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", first.endpoint)
        storage._FILESYSTEMS.clear()
        new_bucket_named("data")
        upload(url, payload)
        written = []

        def kill_after_first_chunk(n: int) -> None:
            written.append(n)
            if len(written) == 1:
                first.kill()

        with pytest.raises(StorageError) as exc:
            cache.fetch("s3://data/sets", cache_dir=tmp_path, chunk_size=chunk, progress=kill_after_first_chunk)
    finally:
        first.kill()
    assert exc.value.kind == "unreachable"
    assert str(exc.value).startswith(f"{url}: cannot reach {first.endpoint}"), exc.value
    target = cache.local_dir("s3://data/sets", tmp_path)
    assert not (target / "blob.bin").exists()  # nothing a later run could take as complete
    parts = list(target.glob(".blob.bin.*.part"))
    assert len(parts) == 1 and chunk <= parts[0].stat().st_size < len(payload)
    kept = parts[0].stat().st_size
    assert parts[0].read_bytes() == payload[:kept]

    second = KilledServer()  # a fresh, empty server: the same object uploaded again (same ETag)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", second.endpoint)
        storage._FILESYSTEMS.clear()
        new_bucket_named("data")
        upload(url, payload)
        item = storage.list_files("s3://data/sets")[0]
        assert not cache.is_cached(target, item)
        counted = []
        root = cache.fetch("s3://data/sets", cache_dir=tmp_path, chunk_size=chunk, progress=counted.append)
    finally:
        second.kill()
    assert (root / "blob.bin").read_bytes() == payload
    assert counted[0] == kept and sum(counted) == len(payload)  # resumed after the bytes it had
    assert not list(target.glob("*.part*"))


def new_bucket_named(name: str) -> None:
    storage.filesystem(f"s3://{name}").mkdir(name)


def test_changed_or_corrupt_partial_is_never_accepted(s3: Server, tmp_path: Path) -> None:
    bucket = new_bucket()
    url = f"s3://{bucket}/d"
    old, new = os.urandom(300_000), os.urandom(300_000)
    upload(f"{url}/f.bin", old)
    item = storage.list_files(url)[0]
    target = cache.local_dir(url, tmp_path)
    target.mkdir(parents=True)
    part = target / f".f.bin.{os.uname().nodename}.part"

    # a partial of an object that has changed since: thrown away, the new object downloaded whole
    part.write_bytes(old[:100_000])
    part.with_name(part.name + ".json").write_text(json.dumps({"etag": item.etag, "size": item.size}))
    upload(f"{url}/f.bin", new)
    assert (cache.fetch(url, cache_dir=tmp_path, chunk_size=65536) / "f.bin").read_bytes() == new

    # a partial whose bytes are wrong: the MD5 check refuses it, discards it, and the next run is right
    (target / "f.bin").unlink()
    item = storage.list_files(url)[0]
    assert item.etag == hashlib.md5(new).hexdigest()
    part.write_bytes(b"\0" * 100_000)
    part.with_name(part.name + ".json").write_text(json.dumps({"etag": item.etag, "size": item.size}))
    with pytest.raises(StorageError, match=rf"^{url}/f\.bin: the download is incomplete or corrupt \(the MD5 of "
                                           r"the bytes is [0-9a-f]{32}, the ETag says [0-9a-f]{32}\); it was discarded"):
        cache.fetch(url, cache_dir=tmp_path, chunk_size=65536)
    assert not (target / "f.bin").exists() and not part.exists()
    assert (cache.fetch(url, cache_dir=tmp_path, chunk_size=65536) / "f.bin").read_bytes() == new

    # a complete file whose record is gone (a crash between the rename and the record): downloaded again
    (target / ".f.bin.json").unlink()
    assert not cache.is_cached(target, item)


# --------------------------------------------------------------------------- lazy imports


@pytest.mark.slow
def test_local_paths_never_import_the_storage_extra(tmp_path: Path) -> None:
    code = f"""
import sys
sys.path.insert(0, {str(EXAMPLES)!r})
import common
from npu_migrate.data import cache, storage
storage.write_bytes_atomic({str(tmp_path / 'ckpt' / 'last.pt')!r}, b"x")
assert storage.read_bytes({str(tmp_path / 'ckpt' / 'last.pt')!r}) == b"x"
assert cache.fetch({str(tmp_path)!r}) == __import__("pathlib").Path({str(tmp_path)!r})
print(sorted(m for m in ("s3fs", "botocore", "aiobotocore", "boto3", "aiohttp") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
