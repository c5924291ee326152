"""Test-only torch_npu that fails like one installed without the CANN toolkit sourced."""

raise ImportError("libascendcl.so: cannot open shared object file: No such file or directory")
