"""Tests of :mod:`npu_migrate.device` and its table (npu_migrate.registry): families, choice, calls."""
