"""Tests of npu_migrate.profile (--profile); child scripts in scripts/."""
