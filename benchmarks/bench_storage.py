"""Remote data: the verified, resumable per-node download against s3fs's plain whole-object get.

Usage::

    python benchmarks/bench_storage.py            # 64 MB object, 3 repetitions
    python benchmarks/bench_storage.py --mb 16 --repeat 2

Starts moto's S3 server on 127.0.0.1 (nothing leaves loopback), uploads one random object and
times, in one process and alternating: ``fs.get_file`` (the baseline: one GET, no checks),
``cache.fetch`` into an empty cache (one streaming GET written in ``--chunk-mb`` pieces to a
``.part`` file, MD5 against the ETag, fsync, rename), and ``cache.fetch`` again (the cache hit: one listing). Needs the storage and dev extras.
Figures on loopback measure client overhead, not a network.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="Object size in MB (default: %(default)s).")
    parser.add_argument("--chunk-mb", type=int, default=1, help="Bytes per write and progress update, in MiB (default: %(default)s).")
    parser.add_argument("--repeat", type=int, default=3, help="Repetitions of each (default: %(default)s).")
    args = parser.parse_args()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    for name in [n for n in os.environ if n.startswith(("AWS_", "OSS_"))]:
        del os.environ[name]
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1", NO_PROXY="127.0.0.1")
    from npu_migrate.data import cache, storage

    fs = storage.filesystem("s3://bench")
    fs.mkdir("bench")
    payload = os.urandom(args.mb * 10**6)
    storage.write_bytes_atomic("s3://bench/data/blob.bin", payload)
    work = Path(tempfile.mkdtemp(prefix="bench_storage_"))
    times: dict[str, list[float]] = {"s3fs get_file (baseline)": [], "cache.fetch, empty cache": [],
                                     "cache.fetch, cached": []}
    try:
        for _ in range(args.repeat):
            shutil.rmtree(work / "plain", ignore_errors=True)
            (work / "plain").mkdir()
            start = time.perf_counter()
            fs.get_file("bench/data/blob.bin", str(work / "plain" / "blob.bin"))
            times["s3fs get_file (baseline)"].append(time.perf_counter() - start)

            shutil.rmtree(work / "cache", ignore_errors=True)
            start = time.perf_counter()
            root = cache.fetch("s3://bench/data", cache_dir=work / "cache", chunk_size=args.chunk_mb * 2**20,
                               progress=lambda n: None)
            times["cache.fetch, empty cache"].append(time.perf_counter() - start)
            assert (root / "blob.bin").stat().st_size == len(payload)

            start = time.perf_counter()
            cache.fetch("s3://bench/data", cache_dir=work / "cache", progress=lambda n: None)
            times["cache.fetch, cached"].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()
    base = statistics.median(times["s3fs get_file (baseline)"])
    print(f"{args.mb} MB object, {args.chunk_mb} MiB writes, median of {args.repeat}, moto on loopback")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:28s} {median:7.3f} s  {args.mb / median:8.1f} MB/s  x{median / base:5.2f} of baseline")


if __name__ == "__main__":
    main()
