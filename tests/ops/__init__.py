"""Tests of ``npu-migrate ops`` (npu_migrate.ops) and ``launch --strict-ops``; child scripts in scripts/."""
