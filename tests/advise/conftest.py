"""Fixtures of the advice tests: the operator audit's cached real torch-npu wheels (``release``, ``every_release``)."""

from __future__ import annotations

from ops.conftest import every_release, release  # noqa: F401 (the same wheels, the same skips)
