"""Training data and checkpoints on a local disk or in object storage (``s3://``, ``oss://``).

Usage::

    from npu_migrate.data import cache, storage

    root = cache.fetch("s3://bucket/mnist", include=["MNIST/raw/*"])   # one download per node
    storage.write_bytes_atomic("oss://bucket/run1/last.pt", payload)    # whole or not at all
    payload = storage.read_bytes("oss://bucket/run1/last.pt")

Modules, each owning one concept:

* :mod:`.storage`: where data and checkpoints live: local paths, ``s3://bucket/prefix``, ``oss://bucket/prefix``.
* :mod:`.urls`: the storage URLs npu_migrate reads and writes (local, ``s3://``, ``oss://``) and their parsing.
* :mod:`.client`: the S3 client behind remote URLs: its settings from the environment, one filesystem per process.
* :mod:`.failures`: what a storage failure becomes: one :class:`~npu_migrate.errors.StorageError` line,
  never a credential.
* :mod:`.cache`: one verified copy of remote data per node: local rank 0 downloads, the other ranks wait.
* :mod:`.keys`: which object keys may become files in the cache, and where (never outside it).
* :mod:`.verify`: whether a cached file holds the bytes of the object it came from, and when to ask.

Remote URLs need the ``storage`` extra (``pip install 'npu-migrate[storage]'``: fsspec and s3fs),
imported only when such a URL is used.
"""

from __future__ import annotations
