"""Tests of npu_migrate.compare; child scripts in scripts/."""
