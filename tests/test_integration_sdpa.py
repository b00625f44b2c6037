"""diyflash.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention (issue 26):
PyTorch's own usage examples (scaled down), a sweep of shapes, SDPA's top-left is_causal with L != S,
key-padding masks, GQA, scale, gradients, under the 2x rule with SDPA in float64 as the oracle, and the
refusals. The same file runs on CPU (interpreter) and on CUDA."""

import pytest
import torch
import torch.nn.functional as F

import diyflash
from diyflash.utils.validation import compare_with_oracle

from helpers import ON_GPU, cancellation_bands


def _check(q, k, v, **kw):
    """The 2x rule on out, dq, dk, dv; the gradients with FlashAttention's cancellation band
    (helpers.cancellation_bands: with one key, plain autograd's dk is 0 exactly, ours sums the group's
    rows of dp - delta)."""
    def reference(q, k, v, upcast):  # compare_with_oracle passes float64 inputs for the oracle
        return F.scaled_dot_product_attention(q, k, v, **kw)

    dout = torch.randn(q.shape[:-1] + v.shape[-1:], generator=torch.Generator().manual_seed(1)).to(q.device, q.dtype)
    out, grads, reports = compare_with_oracle(lambda q, k, v: diyflash.scaled_dot_product_attention(q, k, v, **kw),
                                              reference, (q, k, v), "out", ("dq", "dk", "dv"), dout=dout)
    assert out.shape == F.scaled_dot_product_attention(q, k, v, **kw).shape and out.dtype == q.dtype
    assert reports[0].ok, str(reports[0])
    terms = cancellation_bands(q, k, v, dout, kw.get("scale") or q.shape[-1] ** -0.5)
    for report in reports[1:]:
        assert not report.has_nan and report.err <= report.bound + terms[report.name], (
            f"{report} (cancellation band {terms[report.name]:.3e})")


def _qkv(b, h, h_kv, l, s, e, dtype, device, ev=None):
    gen = torch.Generator().manual_seed(b * 1000 + l * 10 + s)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)  # noqa: E731
    return make(b, h, l, e), make(b, h_kv, s, e), make(b, h_kv, s, ev or e)


def test_pytorch_docs_examples(device):
    """The examples of F.scaled_dot_product_attention's docstring, scaled down (32, 8, 128, 64 -> 2, 8, 40, 64)."""
    dtype = torch.float16 if ON_GPU else torch.float32
    q, k, v = _qkv(2, 8, 8, 40, 40, 64, dtype, device)
    torch.testing.assert_close(diyflash.scaled_dot_product_attention(q, k, v),
                               F.scaled_dot_product_attention(q, k, v), atol=2e-3, rtol=0)
    q, k, v = _qkv(2, 32, 8, 40, 40, 64, dtype, device)  # the GQA example
    torch.testing.assert_close(diyflash.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                               F.scaled_dot_product_attention(q, k, v, enable_gqa=True), atol=2e-3, rtol=0)


@pytest.mark.parametrize("l,s", [(1, 1), (17, 17), (113, 40), (40, 113), (1, 113), (64, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("h,h_kv", [(4, 4), (8, 2)])
def test_sweep(device, l, s, is_causal, h, h_kv):
    q, k, v = _qkv(2, h, h_kv, l, s, 32, torch.float32, device)
    _check(q, k, v, is_causal=is_causal, enable_gqa=h != h_kv)


def test_scale_head_dim_80_and_3d(device):
    q, k, v = _qkv(2, 3, 3, 33, 47, 80, torch.float32, device)
    _check(q, k, v, scale=0.3)
    _check(q[0], k[0], v[0], is_causal=True)


@pytest.mark.parametrize("shape", ["b11s", "11s", "1s"])
def test_key_padding_masks(device, shape):
    q, k, v = _qkv(3, 4, 2, 19, 23, 32, torch.float32, device)
    keep = torch.ones(3, 23, dtype=torch.bool)
    keep[1, 15:] = False  # right padding
    keep[2, :6] = False  # left padding
    keep[0, 9] = False  # a hole
    mask = {"b11s": keep[:, None, None, :], "11s": keep[1][None, None, :], "1s": keep[2][None, :]}[shape].to(device)
    _check(q, k, v, attn_mask=mask, enable_gqa=True)


def test_rows_that_see_no_key_are_zero_where_sdpa_gives_nan(device):
    q, k, v = _qkv(2, 2, 2, 5, 7, 16, torch.float32, device)
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool, device=device)
    keep[1] = False
    out = diyflash.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert (out[1] == 0).all() and torch.isfinite(out).all()
    torch.testing.assert_close(out[0], F.scaled_dot_product_attention(q, k, v, attn_mask=keep)[0])


def test_what_the_kernels_cannot_express_raises(device):
    q, k, v = _qkv(2, 4, 4, 8, 8, 16, torch.float32, device)
    cases = [
        (dict(dropout_p=0.1), NotImplementedError, "dropout_p=0.1"),
        (dict(attn_mask=torch.zeros(8, 8, device=device)), NotImplementedError, "additive"),
        (dict(attn_mask=torch.ones(2, 1, 8, 8, dtype=torch.bool, device=device)), NotImplementedError, "general mask"),
        (dict(attn_mask=torch.ones(8, dtype=torch.bool, device=device), is_causal=True), RuntimeError, "is_causal"),
    ]
    for kw, exc, phrase in cases:
        with pytest.raises(exc, match=phrase):
            diyflash.scaled_dot_product_attention(q, k, v, **kw)
    with pytest.raises(RuntimeError, match="enable_gqa"):
        diyflash.scaled_dot_product_attention(q, k[:, :2], v[:, :2])
    with pytest.raises(NotImplementedError, match="3-D or 4-D"):
        diyflash.scaled_dot_product_attention(q[None], k[None], v[None])
