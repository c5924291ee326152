"""``import npu_migrate.auto`` as a script's first line: run its CUDA code on the detected device.

Usage::

    import npu_migrate.auto  # noqa: F401  (first line of train.py)
    import torch
    model = model.cuda()     # lands on npu:i on Ascend, on the CPU on a laptop

It installs runtime migration in this process and exports it to every process the script starts.
See :mod:`npu_migrate.migrate`.
"""

from npu_migrate.migrate import install

install(propagate=True)
