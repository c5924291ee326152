"""Tests of :mod:`npu_migrate.libs`: the shims against references written here, the CUDA-only libraries' table."""
