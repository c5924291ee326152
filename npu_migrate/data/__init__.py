"""Training data and checkpoints on a local disk or in object storage (``s3://``, ``oss://``).

Usage::

    from npu_migrate.data import cache, storage

    root = cache.fetch("s3://bucket/mnist", include=["MNIST/raw/*"])   # one download per node
    storage.write_bytes_atomic("oss://bucket/run1/last.pt", payload)    # whole or not at all
    payload = storage.read_bytes("oss://bucket/run1/last.pt")

``storage`` owns URLs, credentials, the S3 client's settings and the one-line errors; ``cache``
owns the per-node copy of remote data. Remote URLs need the ``storage`` extra
(``pip install 'npu-migrate[storage]'``: fsspec and s3fs), imported only when such a URL is used.
"""

from __future__ import annotations
