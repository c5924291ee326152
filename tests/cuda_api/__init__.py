"""Tests of :mod:`npu_migrate.cuda_api`: every torch.cuda name has a row, and what each row drives."""
