"""Tests of npu_migrate.data (object storage, the cache); child scripts in scripts/."""
