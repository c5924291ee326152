"""Test-only torch_npu whose metadata says it was built for torch 1.11 (an older release line).

npu_migrate must refuse it from the metadata alone, before importing it -- and, on torch >= 2.5,
before importing torch, which would auto-load it through its torch.backends entry point. A real
mismatched build can abort the interpreter at import; this one raises instead.
"""

raise AssertionError("npu_migrate imported a torch_npu whose version does not match torch")
