"""CUDA calls that raised TypeError on older torch-npu releases, under runtime migration on the stand-in NPU.

Run with tests/fake_npu on PYTHONPATH and ``FAKE_NPU_RELEASE`` naming a release whose
``is_bf16_supported``, ``memory_snapshot`` and ``MemPool`` take none of CUDA's newer arguments
(tests/migrate/test_fit.py picks it from the stand-in's table). Prints each answer, and the
one-line refusals of the calls whose argument the release cannot honour.
"""

import torch
import torch_npu

from npu_migrate import migrate
from npu_migrate.device import extension
from npu_migrate.errors import MigrationError

print(f"torch-npu {torch_npu.__version__}")
try:
    torch.npu.is_bf16_supported(including_emulation=False)
except TypeError as exc:
    print(f"without migration: TypeError: {exc}")
# The device layer refuses a torch-npu release built for another torch (rightly: a real one can
# abort the interpreter); the stand-in only takes the older release's signatures, on this torch.
extension._mismatch = lambda spec, version: None
with migrate.enabled(device="npu"):
    print("is_bf16_supported:", torch.cuda.is_bf16_supported(including_emulation=False),
          torch.cuda.is_bf16_supported(True))
    print("memory_snapshot:", torch.cuda.memory_snapshot(None, include_traces=False),
          torch.cuda.memory_snapshot(mempool_id=None))
    print("MemPool:", type(torch.cuda.MemPool(use_on_oom=False)).__name__,
          type(torch.cuda.MemPool(None, no_split=False)).__name__)
    for call in (lambda: torch.cuda.MemPool(use_on_oom=True), lambda: torch.cuda.memory_snapshot(mempool_id=(1, 2))):
        try:
            call()
        except MigrationError as exc:
            print(f"MigrationError: {exc}")
