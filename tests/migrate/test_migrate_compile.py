"""torch.compile under runtime migration: compiled code gets the answers eager code gets."""

from __future__ import annotations

import shutil

import pytest
import torch


def branchy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Code that computes something else depending on what it is told about CUDA."""
    y = x * 2 if torch.cuda.is_available() else x - 1
    if x.is_cuda:
        y = y + 10
    with torch.autocast("cuda"):
        z = y @ y
    with torch.cuda.amp.autocast():
        w = x @ x
    return z, w


def _c_compiler_works() -> bool:
    return any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))


BACKENDS = ["eager", pytest.param("inductor", marks=pytest.mark.skipif(
    not _c_compiler_works(), reason="inductor needs a C compiler (cc, gcc or clang) on PATH"))]


@pytest.mark.long
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_and_eager_code_agree(backend: str) -> None:
    from npu_migrate import migrate

    torch._dynamo.reset()
    try:
        with migrate.enabled(device="cpu"):
            x = torch.arange(16.0).reshape(4, 4).cuda()
            eager = branchy(x)
            compiled = torch.compile(branchy, backend=backend)(x)
            assert (torch.cuda.is_available(), x.is_cuda) == (True, True)
        for e, c in zip(eager, compiled):
            assert e.dtype == c.dtype == torch.bfloat16  # the CPU target's AMP dtype, compiled too
            assert torch.equal(e, c)
        if backend == "eager":  # inductor compiles once only: its kernels cost seconds each
            # Without migration the same compiled function sees torch's own answers again.
            torch._dynamo.reset()
            plain = torch.compile(branchy, backend=backend)(torch.arange(16.0).reshape(4, 4))
            assert plain[0].dtype == torch.float32
    finally:
        torch._dynamo.reset()
