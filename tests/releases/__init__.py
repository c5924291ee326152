"""Tests of :mod:`npu_migrate.releases`: torch/torch-npu pairs read from the real wheels."""
