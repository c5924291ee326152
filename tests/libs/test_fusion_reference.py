"""The simulated NPU's reference ``npu_fusion_attention`` matches the released operator's declaration and docs.

The reference (tests/fake_npu/torch_npu/_fusion_attention.py) is loaded by file path on CPU tensors,
so this process does not get the stand-in's npu device. Its parameters are compared with the
declaration in the released torch-npu wheel; its behaviour with what the wheel's documentation
(``torch_npu/_op_plugin_docs.py``) says: layouts, mask polarity, sparse modes, scale, keep_prob, GQA.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import re

import pytest
import torch

from conftest import FAKE_NPU, released_wheel

_spec = importlib.util.spec_from_file_location("fusion_reference", FAKE_NPU / "torch_npu" / "_fusion_attention.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

RELEASE = "2.14.0"
TRIU = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


@pytest.fixture(scope="module")
def wheel_declaration() -> list[tuple[str, str]]:
    """``(name, default)`` of each parameter of ``npu_fusion_attention`` as the wheel's codegen yaml declares it."""
    release = released_wheel(RELEASE)
    text = release.read_text("torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml")
    match = re.search(r"func: npu_fusion_attention\((.*?)\) ->", text)
    assert match, "npu_fusion_attention is no longer declared in the wheel's codegen yaml"
    params = []
    for item in match.group(1).split(", "):
        if item == "*":
            continue
        declared = item.split(" ", 1)[1]
        name, _, default = declared.partition("=")
        params.append((name, default))
    return params


def test_reference_parameters_are_the_wheels(wheel_declaration: list[tuple[str, str]]) -> None:
    ours = inspect.signature(ref.npu_fusion_attention).parameters
    assert list(ours) == [name for name, _ in wheel_declaration]
    for name, default in wheel_declaration:
        if not default:
            assert ours[name].default is inspect.Parameter.empty, name
            continue
        value = {"None": None, "True": True, "False": False, '""': ""}.get(default, default)
        if isinstance(value, str) and value and value[0].isdigit():
            value = float(value) if "." in value else int(value)
        assert ours[name].default == value, f"{name}: ours {ours[name].default!r}, wheel {default}"


def test_documented_defaults_are_the_traps(wheel_declaration: list[tuple[str, str]]) -> None:
    """The reasons the NPU path passes scale and a mask: scale defaults to 1.0, tokens to unbounded."""
    declared = dict(wheel_declaration)
    assert declared["scale"] == "1." and declared["keep_prob"] == "1."
    assert declared["pre_tockens"] == declared["next_tockens"] == "2147483647"


def _naive(q, k, v, keep, scale):  # BNSD
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~keep, float("-inf"))
    return (scores.softmax(-1).nan_to_num(0.0) @ v.float()).to(q.dtype)


def _qkv(b=2, n=4, nkv=4, sq=5, skv=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, sq, d, generator=g), torch.randn(b, nkv, skv, d, generator=g),
            torch.randn(b, nkv, skv, d, generator=g))


def test_layouts_give_the_same_attention() -> None:
    q, k, v = _qkv()
    want = ref.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.3)[0]
    bsnd = ref.npu_fusion_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 4, "BSND", scale=0.3)[0]
    torch.testing.assert_close(bsnd.transpose(1, 2), want)
    bsh = [x.transpose(1, 2).flatten(2) for x in (q, k, v)]
    got = ref.npu_fusion_attention(*bsh, 4, "BSH", scale=0.3)[0]
    torch.testing.assert_close(got, want.transpose(1, 2).flatten(2))
    sbh = [x.transpose(0, 1) for x in bsh]
    got = ref.npu_fusion_attention(*sbh, 4, "SBH", scale=0.3)[0]
    torch.testing.assert_close(got, want.transpose(1, 2).flatten(2).transpose(0, 1))
    torch.testing.assert_close(want, _naive(q, k, v, torch.ones(5, 7, dtype=torch.bool), 0.3))


def test_scale_defaults_to_one_not_inverse_sqrt_d() -> None:
    q, k, v = _qkv()
    got = ref.npu_fusion_attention(q, k, v, 4, "BNSD")[0]
    torch.testing.assert_close(got, _naive(q, k, v, torch.ones(5, 7, dtype=torch.bool), 1.0))
    assert not torch.allclose(got, _naive(q, k, v, torch.ones(5, 7, dtype=torch.bool), 1 / math.sqrt(8)))


def test_mask_true_means_masked_out_and_none_ignores_sparse_mode() -> None:
    q, k, v = _qkv()
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(3)) > 0.5
    mask[:, 0] = False
    got = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=mask, scale=0.5)[0]
    torch.testing.assert_close(got, _naive(q, k, v, ~mask, 0.5))
    full = ref.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.5, sparse_mode=3, next_tockens=0)[0]
    torch.testing.assert_close(full, _naive(q, k, v, torch.ones(5, 7, dtype=torch.bool), 0.5))


@pytest.mark.parametrize("sq,skv", [(5, 7), (7, 5), (6, 6)])
def test_sparse_modes_2_3_4_are_the_documented_regions(sq: int, skv: int) -> None:
    q, k, v = _qkv(sq=sq, skv=skv)
    i, j = torch.arange(sq)[:, None], torch.arange(skv)[None]
    regions = {2: j <= i, 3: j <= i + skv - sq, 4: (j <= i + skv - sq + 1) & (j >= i + skv - sq - 2)}
    for mode, keep in regions.items():
        got = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=TRIU, scale=0.5, sparse_mode=mode,
                                       pre_tockens=2, next_tockens=1)[0]
        torch.testing.assert_close(got, _naive(q, k, v, keep, 0.5), msg=f"sparse_mode {mode}")


def test_causal_modes_require_the_compressed_mask() -> None:
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="compressed 2048x2048"):
        ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=torch.ones(5, 7, dtype=torch.bool).triu(1),
                                 sparse_mode=3)


def test_grouped_query_heads_and_keep_prob() -> None:
    q, k, v = _qkv(n=4, nkv=2)
    got = ref.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.5)[0]
    want = _naive(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), torch.ones(5, 7, dtype=torch.bool), 0.5)
    torch.testing.assert_close(got, want)
    torch.manual_seed(0)
    dropped = ref.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.5, keep_prob=0.5)[0]
    assert not torch.allclose(dropped, got)


def test_softmax_statistics_give_the_log_sum_exp() -> None:
    q, k, v = _qkv()
    _, row_max, row_sum, *rest = ref.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.5)
    assert row_max.shape == (2, 4, 5, 8) and row_max.dtype == torch.float32 and rest == [rest[0], 0, 0, 0]
    lse = row_max[..., 0] + row_sum[..., 0].log()
    torch.testing.assert_close(lse, ((q @ k.transpose(-1, -2)) * 0.5).logsumexp(-1))


def test_tnd_takes_cumulative_lengths_without_the_leading_zero() -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(5, 2, 8, generator=g), torch.randn(6, 2, 8, generator=g), torch.randn(6, 2, 8, generator=g)
    out, row_max, *_ = ref.npu_fusion_attention(q, k, v, 2, "TND", atten_mask=TRIU, scale=0.5, sparse_mode=3,
                                                actual_seq_qlen=[2, 5], actual_seq_kvlen=[3, 6])
    assert row_max.shape == (5, 2, 8)
    for (qa, qb), (ka, kb) in (((0, 2), (0, 3)), ((2, 5), (3, 6))):
        sq, skv = qb - qa, kb - ka
        keep = torch.arange(skv)[None] <= torch.arange(sq)[:, None] + skv - sq
        want = _naive(*(x.transpose(0, 1)[None] for x in (q[qa:qb], k[ka:kb], v[ka:kb])), keep, 0.5)
        torch.testing.assert_close(out[qa:qb], want[0].transpose(0, 1))
    with pytest.raises(RuntimeError, match="WITHOUT the leading 0"):
        ref.npu_fusion_attention(q, k, v, 2, "TND", actual_seq_qlen=[0, 2, 5], actual_seq_kvlen=[0, 3, 6])
