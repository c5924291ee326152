"""The attention shim against a direct SDPA call on CPU: forward + backward, one run, one process.

Usage::

    python benchmarks/bench_attention.py                  # B=4, S=256, 8 heads, D=64, float32
    python benchmarks/bench_attention.py --causal --repeats 30

``flash_attn_func(q, k, v)`` from :mod:`npu_migrate.libs.flash_attn` takes flash-attn's
``[B, S, H, D]`` layout; the baseline is what a user would write by hand for the same result:
``F.scaled_dot_product_attention`` on ``transpose(1, 2)`` views, transposed back. Both run
interleaved (A, B, A, B...) after a warm-up, so drift in a shared machine's load hits both alike;
the figure is the ratio of medians. Goal (issue 20): <= 1.05.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from npu_migrate.libs.flash_attn import flash_attn_func


def direct(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def shim(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return flash_attn_func(q, k, v, causal=causal)


def step(fn, q, k, v, grad, causal) -> float:
    start = time.perf_counter()
    out = fn(q, k, v, causal)
    out.backward(grad)
    elapsed = time.perf_counter() - start
    q.grad = k.grad = v.grad = None
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="B (default: %(default)s)")
    parser.add_argument("--seq", type=int, default=256, help="S (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=8, help="heads (default: %(default)s)")
    parser.add_argument("--dim", type=int, default=64, help="D (default: %(default)s)")
    parser.add_argument("--causal", action="store_true", help="causal attention (Sq == Skv: both top-left)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds of each (default: %(default)s)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    shape = (args.batch, args.seq, args.heads, args.dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape)
    torch.testing.assert_close(shim(q, k, v, args.causal), direct(q, k, v, args.causal))
    for _ in range(args.warmup):
        step(direct, q, k, v, grad, args.causal)
        step(shim, q, k, v, grad, args.causal)
    times: dict[str, list[float]] = {"direct": [], "shim": []}
    for _ in range(args.repeats):
        times["direct"].append(step(direct, q, k, v, grad, args.causal))
        times["shim"].append(step(shim, q, k, v, grad, args.causal))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(json.dumps({
        "shape": list(shape), "causal": args.causal, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "direct_ms": round(medians["direct"] * 1e3, 3), "shim_ms": round(medians["shim"] * 1e3, 3),
        "ratio": round(medians["shim"] / medians["direct"], 3), "goal": 1.05,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
