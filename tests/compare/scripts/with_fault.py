"""Test-only: run SCRIPT ARGS with one module's output shifted, as a faulty kernel would.

Usage::

    NPU_MIGRATE_TEST_FAULT=fc1 python with_fault.py examples/mnist.py --dry-run

The module named by NPU_MIGRATE_TEST_FAULT (a name inside the model, as ``get_submodule``
takes it) gets NPU_MIGRATE_TEST_FAULT_SHIFT (default 1e-2) added to its output, inside its own
forward, so what the module returns is wrong and everything after it inherits the error.
"""

import os
import runpy
import sys

import torch

NAME = os.environ["NPU_MIGRATE_TEST_FAULT"]
SHIFT = float(os.environ.get("NPU_MIGRATE_TEST_FAULT_SHIFT", "1e-2"))
_done: set = set()


def _arm(module: torch.nn.Module, args: tuple) -> None:
    try:
        target = module.get_submodule(NAME)
    except AttributeError:
        return
    if id(target) in _done:
        return
    _done.add(id(target))
    forward = target.forward
    target.forward = lambda *a, **k: forward(*a, **k) + SHIFT


torch.nn.modules.module.register_module_forward_pre_hook(_arm)
script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
runpy.run_path(script, run_name="__main__")
