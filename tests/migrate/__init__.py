"""Tests of runtime migration (npu_migrate.migrate, libs, ops, exit); child scripts in scripts/."""
