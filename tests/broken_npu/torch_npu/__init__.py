"""Test-only torch_npu that fails like one installed without the CANN toolkit sourced.

Its torch.backends entry point (torch_npu_stand_in-0.dist-info) is the real wheel's, so on
torch >= 2.5 ``import torch`` itself fails here, as it does on such a node.
"""

raise ImportError("libascendcl.so: cannot open shared object file: No such file or directory")
