"""Tests of runtime migration (npu_migrate.migrate, its libs hook, exit); child scripts in scripts/."""
