"""The patches runtime migration applies, one module per area of torch.

Usage::

    from npu_migrate.migrate.patches import AREAS

    for install_area in AREAS:      # what npu_migrate.migrate.install.install() does, in this order
        install_area()

* :mod:`.tensors`: factories (``device=``), ``Tensor.to``/``.cuda``/``.is_cuda``, ``Module.to``/``.cuda``.
* :mod:`.serialization`: ``torch.load``'s ``map_location``.
* :mod:`.distributed`: backends, ``DistributedDataParallel``, ``SyncBatchNorm``.
* :mod:`.data_amp`: ``DataLoader(pin_memory=)``, ``torch.autocast``, ``GradScaler``.
* :mod:`.optim`: optimizers asked for ``fused=True`` where torch has no fused kernel for the target.
* :mod:`.cuda_namespace`: every public callable of ``torch.cuda`` and ``torch.cuda.amp``.
* :mod:`.streams`: ``torch.cuda`` streams, events and ``torch.cuda.nvtx``.
* :mod:`.accelerator`: ``torch.accelerator``, DeviceMesh's device type, ``Module.to_empty(device=)``.
* :mod:`.compiled`: ``torch.compile`` sees the same answers as eager code.
* :mod:`.processes`: reports written by forked and multiprocessing children.

Each ``install()`` reads :data:`npu_migrate.migrate.state.STATE` and records every attribute it
replaces with :func:`npu_migrate.migrate.state.patch`.
"""

from __future__ import annotations

from typing import Callable

from npu_migrate.migrate.patches import (accelerator, compiled, cuda_namespace, data_amp, distributed, optim,
                                         processes, serialization, streams, tensors)

AREAS: tuple[Callable[[], None], ...] = (
    tensors.install, serialization.install, distributed.install, data_amp.install, optim.install, cuda_namespace.install,
    streams.install_nvtx, accelerator.install, compiled.install, processes.install,
)
