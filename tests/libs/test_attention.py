"""The attention shims equal naive softmax attention written here, on CPU (SDPA) and on the simulated NPU.

Each case draws small random shapes from its seed and checks the output and the gradients of q, k, v
(and the log-sum-exp where the shim returns it) of flash-attn's and xformers' APIs against
:func:`naive`: causal top-left and bottom-right with ``Sq != Skv``, sliding windows, grouped-query
heads, varlen batches, a bias, in float32, float16 and bfloat16. The NPU tier runs every case in one
child process with tests/fake_npu first on the path, where the shims go through
``torch_npu.npu_fusion_attention`` (its reference, tests/fake_npu/torch_npu/_fusion_attention.py):
``python tests/libs/test_attention.py OUT.json`` is that child.

Tolerances: float32 as torch.testing's defaults allow for a different summation order (rtol 1e-4,
atol 1e-5); half precision as flash-attn's own tests compare kernels with a float32 reference
(float16 2e-3, bfloat16 2e-2, relative and absolute), the inputs being the same rounded values.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
if __name__ != "__main__":
    from conftest import FAKE_NPU, child_env

from npu_migrate.errors import MigrationError  # noqa: E402
from npu_migrate.libs import flash_attn as fa  # noqa: E402
from npu_migrate.libs import xformers as xf  # noqa: E402
from npu_migrate.libs.attention import Causal, attention  # noqa: E402

TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# --------------------------------------------------------------------------- the reference


def allowed(sq: int, skv: int, causal: str, window: tuple[int, int] | None) -> torch.Tensor:
    """True where query i may read key j, from the libraries' documentation."""
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if causal == "top_left":  # SDPA is_causal, xformers LowerTriangularMask
        keep &= j <= i
    if causal == "bottom_right":  # flash-attn >= 2.1 causal=True, xformers ...FromBottomRightMask
        keep &= j <= i + skv - sq
    if window is not None:  # flash-attn window_size: [i + Skv - Sq - left, i + Skv - Sq + right]
        left, right = window
        if left >= 0:
            keep &= j >= i + skv - sq - left
        if right >= 0:
            keep &= j <= i + skv - sq + right
    return keep


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, scale: float,
          bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias, masked) v in float32 on [B, S, H, D]; rows with no key give 0 and lse +inf."""
    q, k, v = q.float(), k.float(), v.float()
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if bias is not None:
        scores = scores + bias.float()
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    lse = lse.masked_fill(~keep.any(-1), float("inf"))
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), lse


# --------------------------------------------------------------------------- the cases

CAUSAL = {"none": Causal.NONE, "top_left": Causal.TOP_LEFT, "bottom_right": Causal.BOTTOM_RIGHT}


def cases() -> list[dict]:
    out = []
    shapes = [(5, 5), (3, 7), (7, 3)]  # Sq == Skv, Sq < Skv, Sq > Skv
    heads = [(2, 2), (4, 2), (4, 1)]  # MHA, GQA, MQA
    combos = [
        ("flash", "none", None, False), ("flash", "bottom_right", None, False), ("flash", "none", (2, 1), False),
        ("flash", "bottom_right", (2, -1), False), ("flash", "none", (-1, 0), False), ("flash_alibi", "bottom_right", None, True),
        ("varlen", "none", None, False), ("varlen", "bottom_right", None, False), ("varlen", "none", (1, 2), False),
        ("xformers", "top_left", None, False), ("xformers", "bottom_right", None, False), ("xformers", "none", None, True),
        ("xformers", "top_left", None, True), ("xformers_block", "top_left", None, False),
        ("xformers_block", "none", None, False), ("xformers_block", "bottom_right", None, False),
    ]
    for n, ((shim, causal, window, bias), dtype) in enumerate(itertools.product(combos, DTYPES)):
        rng = random.Random(n)
        sq, skv = shapes[n % len(shapes)]
        hq, hkv = heads[(n // len(shapes)) % len(heads)]
        out.append(dict(id=f"{shim}-{causal}-w{window}-{'bias' if bias else 'nobias'}-{dtype}-{sq}x{skv}-h{hq}.{hkv}",
                        shim=shim, causal=causal, window=window, bias=bias, dtype=dtype, seed=n, b=rng.choice([1, 2]),
                        sq=sq, skv=skv, hq=hq, hkv=hkv, d=rng.choice([8, 16])))
    return out


CASES = cases()


def _seqlens(rng: random.Random, batch: int, base: int) -> list[int]:
    return [max(1, base + rng.randint(-2, 2)) for _ in range(batch)]


def run_case(case: dict, device: str) -> dict[str, float]:
    """Run one case; returns the worst |error| / tolerance per compared tensor (<= 1 passes)."""
    dtype = DTYPES[case["dtype"]]
    gen = torch.Generator().manual_seed(case["seed"])
    rng = random.Random(case["seed"])
    b, sq, skv, hq, hkv, d = (case[x] for x in ("b", "sq", "skv", "hq", "hkv", "d"))
    shim, causal, window = case["shim"], case["causal"], case["window"]
    scale = rng.choice([None, 0.3])
    varlen = shim in ("varlen", "xformers_block")
    if varlen:
        lens_q = _seqlens(rng, 3, sq)
        lens_k = lens_q if shim == "xformers_block" and causal == "top_left" else _seqlens(rng, 3, skv)
        tq, tk = sum(lens_q), sum(lens_k)
        shapes = [(tq, hq, d), (tk, hkv, d), (tk, hkv, d)]
    else:
        shapes = [(b, sq, hq, d), (b, skv, hkv, d), (b, skv, hkv, d)]
    q, k, v = (torch.randn(s, generator=gen).to(dtype) for s in shapes)
    bias = torch.randn(b, hq, sq, skv, generator=gen).to(dtype) if case["bias"] and shim.startswith("xformers") else None
    slopes = torch.rand(hq, generator=gen) if shim == "flash_alibi" else None
    grad_out = torch.randn(*shapes[0][:-1], d, generator=gen).to(dtype)

    # reference, per sequence for varlen
    s = scale if scale is not None else 1.0 / math.sqrt(d)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if varlen:  # each packed sequence on its own
        outs, lses, qa, ka = [], [], 0, 0
        for lq, lk in zip(lens_q, lens_k):
            o, l_ = naive(qr[qa:qa + lq][None], kr[ka:ka + lk][None], vr[ka:ka + lk][None],
                          allowed(lq, lk, causal, window), s, None)
            outs.append(o[0])
            lses.append(l_[0])
            qa, ka = qa + lq, ka + lk
        ref, ref_lse = torch.cat(outs), torch.cat(lses, dim=-1)
    else:
        full_bias = bias
        if slopes is not None:
            i = torch.arange(sq).unsqueeze(1)
            j = torch.arange(skv).unsqueeze(0)
            full_bias = -slopes[None, :, None, None] * (i + skv - sq - j).abs().float()
        ref, ref_lse = naive(qr, kr, vr, allowed(sq, skv, causal, window), s, full_bias)
    ref.backward(grad_out.float())

    # the shim, on the device
    qs, ks, vs = (t.detach().to(device).requires_grad_() for t in (q, k, v))
    lse = None
    if shim in ("flash", "flash_alibi"):
        out, lse, _ = fa.flash_attn_func(qs, ks, vs, softmax_scale=scale, causal=causal == "bottom_right",
                                         window_size=window or (-1, -1),
                                         alibi_slopes=None if slopes is None else slopes.to(device),
                                         return_attn_probs=True)
    elif shim == "varlen":
        cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device=device)
        out, lse, _ = fa.flash_attn_varlen_func(qs, ks, vs, cu_q, cu_k, max(lens_q), max(lens_k), softmax_scale=scale,
                                                causal=causal == "bottom_right", window_size=window or (-1, -1),
                                                return_attn_probs=True)
    elif shim == "xformers":
        attn_bias = {"none": None, "top_left": xf.LowerTriangularMask(),
                     "bottom_right": xf.LowerTriangularFromBottomRightMask()}[causal]
        if bias is not None:
            attn_bias = bias.to(device) if attn_bias is None else attn_bias.add_bias(bias.to(device))
        out = xf.memory_efficient_attention(qs, ks, vs, attn_bias=attn_bias, scale=scale)
    else:  # xformers_block
        mask = xf.BlockDiagonalMask.from_seqlens(lens_q, lens_k)
        mask = {"none": mask, "top_left": mask.make_causal(), "bottom_right": mask.make_causal_from_bottomright()}[causal]
        out = xf.memory_efficient_attention(qs[None], ks[None], vs[None], attn_bias=mask, scale=scale)[0]
    out.backward(grad_out.to(device))
    assert out.device.type == torch.device(device).type and out.dtype == dtype

    rtol, atol = TOLERANCE[dtype]
    pairs = {"out": (out, ref), "dq": (qs.grad, qr.grad), "dk": (ks.grad, kr.grad), "dv": (vs.grad, vr.grad)}
    if lse is not None:
        pairs["lse"] = (lse, ref_lse)
    worst = {}
    for name, (got, want) in pairs.items():
        got, want = got.detach().cpu().float(), want.detach().float()
        assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)), f"{name}: infinities differ"
        want_dt = want.to(dtype).float() if name != "lse" else want  # the reference rounded like the shim's output
        err = ((got - want_dt).abs() - rtol * want_dt.abs())[finite]
        worst[name] = float((err / atol).max()) if err.numel() else 0.0
    return worst


def check(worst: dict[str, float]) -> None:
    bad = {k: v for k, v in worst.items() if v > 1.0}
    assert not bad, f"beyond tolerance (|err| - rtol*|ref|) / atol: {bad}"


def _cpu_half_works() -> bool:
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
        return True
    except RuntimeError:
        return False


# --------------------------------------------------------------------------- CPU tier


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_shim_equals_naive_attention_on_cpu(case: dict) -> None:
    if case["dtype"] == "float16" and not _cpu_half_works():
        pytest.skip(f"torch {torch.__version__} has no float16 matmul on CPU")
    check(run_case(case, "cpu"))


# --------------------------------------------------------------------------- simulated NPU tier


@pytest.fixture(scope="module")
def npu_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("npu_attention") / "results.json"
    proc = subprocess.run([sys.executable, __file__, str(out)], env=child_env(FAKE_NPU), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.fake_npu
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_shim_equals_naive_attention_on_simulated_npu(case: dict, npu_results: dict[str, dict]) -> None:
    result = npu_results[case["id"]]
    assert "error" not in result, result.get("error")
    check(result)


# --------------------------------------------------------------------------- refusals and details


def test_softcap_is_refused_with_the_argument_and_the_fix() -> None:
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(MigrationError, match=r"softcap=30\.0 has no equivalent.*drop softcap"):
        fa.flash_attn_func(q, q, q, softcap=30.0)


def test_window_with_top_left_causal_is_refused() -> None:
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(MigrationError, match=r"window_size=\(2, 0\).*bottom-right"):
        attention(q, q, q, causal=Causal.TOP_LEFT, window=(2, 0))


def test_bad_heads_say_what_is_expected() -> None:
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match=r"3 query heads and 2/2 key/value heads: the query heads must be a multiple"):
        fa.flash_attn_func(q, k, k)


def test_block_table_and_kvcache_are_refused() -> None:
    q = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(MigrationError, match=r"block_table"):
        fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(MigrationError, match=r"flash_attn_with_kvcache"):
        fa.flash_attn_with_kvcache(q, q, q)


def test_dropout_keeps_the_expectation_and_drops_weights() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(1, 6, 1, 4), torch.randn(1, 6, 1, 4)
    v = torch.ones(1, 6, 1, 4)
    outs = torch.stack([fa.flash_attn_func(q, k, v, dropout_p=0.5) for _ in range(400)])
    assert not torch.allclose(outs[0], torch.ones_like(outs[0]))  # weights really dropped
    torch.testing.assert_close(outs.mean(0), torch.ones_like(outs[0]), rtol=0, atol=0.1)  # scaled by 1/(1-p)


def test_packed_functions_match_the_unpacked_one() -> None:
    torch.manual_seed(1)
    qkv = torch.randn(2, 5, 3, 2, 8)
    want = fa.flash_attn_func(*qkv.unbind(2), causal=True)
    torch.testing.assert_close(fa.flash_attn_qkvpacked_func(qkv, causal=True), want)
    torch.testing.assert_close(fa.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True), want)
    flat = qkv.flatten(0, 1)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    torch.testing.assert_close(fa.flash_attn_varlen_qkvpacked_func(flat, cu, 5, causal=True), want.flatten(0, 1))


def test_xformers_grouped_5d_layout() -> None:
    torch.manual_seed(2)
    q = torch.randn(2, 5, 2, 3, 8)  # B M G H K
    k = torch.randn(2, 5, 2, 1, 8).expand(2, 5, 2, 3, 8)
    out = xf.memory_efficient_attention(q, k, k, attn_bias=xf.LowerTriangularMask())
    ref, _ = naive(q.flatten(2, 3), k[:, :, :, 0], k[:, :, :, 0], allowed(5, 5, "top_left", None), 8 ** -0.5, None)
    torch.testing.assert_close(out, ref.reshape(2, 5, 2, 3, 8), rtol=1e-4, atol=1e-5)


def test_xformers_materialize_and_split() -> None:
    mask, packed = xf.BlockDiagonalMask.from_tensor_list([torch.zeros(1, 2, 4), torch.ones(1, 3, 4)])
    assert packed.shape == (1, 5, 4) and [t.shape[1] for t in mask.split(packed)] == [2, 3]
    dense = mask.make_causal().materialize((5, 5))
    assert torch.equal(torch.isfinite(dense), torch.block_diag(torch.ones(2, 2).tril(), torch.ones(3, 3).tril()).bool())


def _npu_worker(path: str) -> None:
    """The NPU tier's child: every case on npu:0 through the reference operator."""
    import torch_npu  # noqa: F401 - tests/fake_npu's stand-in, first on PYTHONPATH

    results = {}
    for case in CASES:
        try:
            results[case["id"]] = run_case(case, "npu:0")
        except Exception as exc:  # noqa: BLE001 - reported per case to the test
            results[case["id"]] = {"error": f"{type(exc).__name__}: {exc}"}
    Path(path).write_text(json.dumps(results))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    _npu_worker(sys.argv[1])
