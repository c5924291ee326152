"""Following a composite kernel: running, on this machine, the kernel the NPU runs for an operator the release lacks.

Usage::

    from npu_migrate.ops import follow

    key = judge.follow("aten::logcumsumexp", "default")      # DispatchKey.CompositeExplicitAutograd
    args, kwargs = follow.wrap_numbers(func, args, kwargs)     # inside a followed kernel only
    out = follow.run(func, key, args, kwargs)                  # under the dispatch mode, re-entered

When the release registers no kernel for an operator and torch has a composite one
(``CompositeExplicitAutogradNonFunctional``, ``CompositeExplicitAutograd``,
``CompositeImplicitAutograd``), the NPU's dispatcher runs that composite kernel, and what the kernel
calls is what runs on the NPU: ``aten::logcumsumexp``'s kernel calls ``aten::_logcumsumexp``, which
no release registers, so it runs on the host. This machine's CPU has kernels of its own for many of
these operators and would never show the callees; :func:`run` calls the composite kernel itself
(``OpOverload._op_dk``: one dispatch key's kernel, as ``OpOverload.decompose`` does), with the
recorder's dispatch mode pushed again, so every operator the kernel calls reaches the mode, is
judged, and is followed in turn where it is composite too (:mod:`npu_migrate.ops.record`).

A kernel calls its callees in C++ with scalars wrapped as 0-dim tensors; the dispatch mode receives
them as Python numbers where the callee's schema says ``Tensor``, and most overloads refuse a number
there (``bitwise_left_shift.Tensor``). :func:`wrap_numbers` gives them back as 0-dim tensors of the
dtype the wrapped number would have promoted to, so the callee computes what it computes on the NPU.
"""

from __future__ import annotations

from typing import Any

import torch

_NUMBERS = (bool, int, float, complex)
_TENSOR_TYPES = ("Tensor", "Tensor?", "Optional[Tensor]")
_SLOTS: dict[Any, tuple[tuple[int, str], ...]] = {}


def run(func: Any, key: Any, args: tuple, kwargs: dict) -> Any:
    """``func``'s kernel for the composite dispatch key ``key`` (a ``torch._C.DispatchKey``), on ``args``."""
    return func._op_dk(key, *args, **kwargs)


def _tensor_slots(func: Any) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of each argument of ``func``'s schema that takes a tensor."""
    slots = _SLOTS.get(func)
    if slots is None:
        slots = _SLOTS[func] = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                                     if str(a.type) in _TENSOR_TYPES)
    return slots


def wrap_numbers(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with each Python number passed for a tensor argument made a 0-dim tensor."""
    found = None
    for position, name in _tensor_slots(func):
        in_args = position < len(args)
        value = args[position] if in_args else kwargs.get(name)
        if not isinstance(value, _NUMBERS):
            continue
        if found is None:
            found = (list(args), dict(kwargs))
        reference = next((a for a in args if isinstance(a, torch.Tensor)), None)
        dtype = torch.result_type(reference, value) if reference is not None else None
        tensor = torch.tensor(value, dtype=dtype)
        if in_args:
            found[0][position] = tensor
        else:
            found[1][name] = tensor
    return (tuple(found[0]), found[1]) if found is not None else (args, kwargs)
