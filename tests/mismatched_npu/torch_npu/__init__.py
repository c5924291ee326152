"""Test-only torch_npu whose metadata says it was built for torch 2.1.0.

npu_migrate must refuse it from the metadata alone, before importing it.
"""

raise AssertionError("npu_migrate imported a torch_npu whose version does not match torch")
