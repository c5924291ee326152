"""The one table of what each ``torch.cuda`` API becomes on another device family, for both tools.

Usage::

    from npu_migrate.cuda_api import classify

    api = classify("torch.cuda.get_device_capability")
    api.kind      # "mapped"
    api.op        # "device_capability": the device-neutral operation `npu-migrate port` writes
    api.cpu       # "capability": runtime migration's answer on the cpu target
    classify("torch.cuda.graph").note   # what to do instead (the port's report, runtime migration's error)

Every public name of ``torch.cuda`` and its submodules (amp, random, memory, streams, graphs, nvtx,
jiterator) has one :class:`CudaApi` row (:mod:`.namespace`), found by :func:`classify`:

* ``mapped``: has a device-neutral equivalent; ``op`` names it in
  :data:`npu_migrate.port.targets.TARGETS` and ``params`` lists torch.cuda's parameter names,
  in order, so keyword arguments can be renamed to the target's.
* ``noop``: harmless to skip off CUDA (profiling marks, cache tuning, debug switches).
* ``unsupported``: no equivalent; ``note`` says what to do instead.
* ``ignored``: not a device API (exception classes, typing re-exports, constants).

The same row says what runtime migration does with the name (:mod:`.row`): ``cpu`` names its
implementation on the cpu target, ``runtime`` how it is reached where that is not the usual way,
and ``cpu_kind`` with ``why`` where runtime migration's kind deliberately differs from the one
the port kind implies. ``npu_migrate.migrate.patches.cuda_namespace`` and ``.streams`` build
their patches from these rows; tests/cuda_api/test_runtime.py checks what they install
against them.

The same API under Ascend's names (``torch.npu.X``, ``torch_npu.npu.X``) reads the same row:
:func:`normalize` maps those names onto ``torch.cuda.X``. The rest of torch that reaches CUDA
(functions, classes and Tensor methods with a ``device``) has rows in :mod:`.devices`
(:data:`TORCH_API`, :func:`classify_torch`).

Nothing here imports torch at import, so ``npu-migrate port`` and ``check`` stay torch-free.
:func:`public_names` and :func:`device_apis` (used by the tests) import torch when called and list
what torch itself exports, so a torch release that adds an API fails a test until it has a row.
"""

from __future__ import annotations

from npu_migrate.cuda_api.devices import TORCH_API, DeviceParam, classify_torch, device_apis, tensor_cuda_apis
from npu_migrate.cuda_api.namespace import (CUDA_API, FAMILY_PREFIXES, SUBMODULES, classify, normalize,
                                            public_names)
from npu_migrate.cuda_api.row import RUNTIME_KIND, CudaApi, Kind, RuntimeKind

__all__ = [
    "CUDA_API", "FAMILY_PREFIXES", "RUNTIME_KIND", "SUBMODULES", "TORCH_API", "CudaApi", "DeviceParam", "Kind",
    "RuntimeKind", "classify", "classify_torch", "device_apis", "normalize", "public_names", "tensor_cuda_apis",
]
