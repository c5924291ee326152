"""torch.compile: compiled code gets the same answers as eager code under migration.

Usage::

    from npu_migrate.migrate.patches import compiled

    compiled.install()   # torch.autocast("cuda") inside torch.compile runs the target's autocast
                         # (dynamo is patched when torch.compile first runs: importing it costs seconds)

Dynamo evaluates ``torch.cuda.is_available()`` and ``x.is_cuda`` itself while tracing, from its
own frames: :func:`npu_migrate.migrate.callers.is_internal_caller` classifies those calls by the
code being traced, so the patched answers are the ones baked into the graph. ``torch.autocast``
never runs its ``__init__`` under dynamo: dynamo reads the arguments
(``AutocastModeVariable.create``) and puts ``_enter_autocast("cuda", ...)`` in the graph. That
factory is wrapped here so a user's ``"cuda"`` becomes the target, with the target's AMP dtype,
as :mod:`.data_amp` does in eager code.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from npu_migrate.migrate.callers import is_internal, record, traced_filename
from npu_migrate.migrate.state import STATE, patch


def install() -> None:
    """Patch dynamo now if it is imported, else on the first ``torch.compile`` (importing it costs seconds)."""
    import torch

    if "torch._dynamo" in sys.modules:
        _install_dynamo()
        return
    compile_ = torch.compile
    done: list[bool] = []

    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
        if not done:
            done.append(True)
            _install_dynamo()
        return compile_(*args, **kwargs)

    functools.update_wrapper(compile, compile_)
    patch(torch, "compile", compile)


def _install_dynamo() -> None:
    try:
        from torch._dynamo.variables.ctx_manager import AutocastModeVariable
    except ImportError:  # a torch without dynamo: nothing is compiled
        return
    create = AutocastModeVariable.create

    def create_(func: Any, args: Any, kwargs: Any) -> Any:
        var = create(func, args, kwargs)
        values = list(var.target_values)
        traced = traced_filename(sys._getframe(1))
        if values and values[0] == "cuda" and traced is not None and not is_internal(traced):
            spec = STATE.require_target("torch.compile's autocast")
            values[0] = spec.name
            if len(values) > 1 and values[1] is None:
                values[1] = spec.amp_dtype
            var.target_values = type(var.target_values)(values) if isinstance(var.target_values, tuple) else values
            record('torch.autocast(device_type="cuda") in torch.compile')
        return var

    patch(AutocastModeVariable, "create", staticmethod(create_))
    _install_is_cuda()


def _install_is_cuda() -> None:
    """``x.is_cuda`` in traced user code: dynamo answers it from the tensor's device, not the property."""
    from torch._dynamo.variables.constant import ConstantVariable
    from torch._dynamo.variables.tensor import TensorVariable

    def user_answer(self: Any, tx: Any) -> Any:
        code = getattr(tx, "f_code", None)
        if getattr(self, "device", None) is None or code is None or is_internal(code.co_filename):
            return None
        record("Tensor.is_cuda in torch.compile")
        value = self.device.type == STATE.target.name  # type: ignore[union-attr]
        # torch 2.1's ConstantVariable(value) is torch >= 2.2's ConstantVariable.create(value).
        return ConstantVariable.create(value) if hasattr(ConstantVariable, "create") else ConstantVariable(value)

    if hasattr(TensorVariable, "method_attr_is_cuda"):  # newer dynamo: one method per attribute
        is_cuda = TensorVariable.method_attr_is_cuda

        def method_attr_is_cuda(self: Any, tx: Any) -> Any:
            answer = user_answer(self, tx)
            return answer if answer is not None else is_cuda(self, tx)

        patch(TensorVariable, "method_attr_is_cuda", method_attr_is_cuda)
        return
    var_getattr = TensorVariable.var_getattr  # torch 2.1: one method for every attribute

    def var_getattr_(self: Any, tx: Any, name: str) -> Any:
        answer = user_answer(self, tx) if name == "is_cuda" else None
        return answer if answer is not None else var_getattr(self, tx, name)

    patch(TensorVariable, "var_getattr", var_getattr_)
