"""Tests of npu_migrate.launch; its child scripts are in scripts/."""
