"""Autocast (issue 23): every op casts its floating inputs to the autocast dtype, as PyTorch does for SDPA
and matmul, keeps lse fp32, and eager, compiled and the fakes agree. On the GPU this is what makes an
AMP training loop with fp32 activations run the fp16/bf16 kernels instead of the IEEE-fp32 ones."""

import pytest
import torch

import diyflash
from helpers import make_qkv

AMP = (torch.bfloat16, torch.float16)


def _autocast(device, dtype):
    return torch.autocast(device.type, dtype=dtype)


@pytest.mark.parametrize("amp", AMP)
def test_attention_under_autocast_runs_the_low_precision_kernels(device, amp):
    """fp32 activations: the output has the autocast dtype and equals, bit for bit, the op called with
    inputs cast to it; so the fp16/bf16 kernels ran (the fp32 kernels give other bits). lse stays fp32."""
    q, k, v = make_qkv(1, 2, 17, 23, 16, torch.float32, device)
    low = [t.to(amp) for t in (q, k, v)]
    with _autocast(device, amp):
        out = torch.ops.diyflash.attention(q, k, v, causal=True)
        out_api = diyflash.flash_attention(q, k, v, causal=True)
        out_fwd, lse = torch.ops.diyflash.attention_fwd(q, k, v, True, None, None)
    expected, expected_lse = torch.ops.diyflash.attention_fwd(*low, True, None, None)
    assert out.dtype == out_api.dtype == out_fwd.dtype == amp and lse.dtype == torch.float32
    for got in (out, out_api, out_fwd):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(lse, expected_lse, rtol=0, atol=0)


@pytest.mark.parametrize("amp", AMP)
def test_matmul_under_autocast(device, amp):
    a = torch.randn(33, 40, device=device)
    b = torch.randn(40, 17, device=device)
    with _autocast(device, amp):
        c = torch.ops.diyflash.matmul(a, b)
        c_api = diyflash.triton_matmul(a, b)
        ref = torch.matmul(a, b)
    assert c.dtype == c_api.dtype == ref.dtype == amp
    expected = torch.ops.diyflash.matmul(a.to(amp), b.to(amp))
    torch.testing.assert_close(c, expected, rtol=0, atol=0)
    torch.testing.assert_close(c_api, expected, rtol=0, atol=0)


def test_float64_is_left_alone(device):
    """Autocast never casts float64 (gradcheck's dtype), and neither do the ops."""
    q, k, v = make_qkv(1, 1, 5, 5, 8, torch.float64, device)
    with _autocast(device, torch.bfloat16):
        out = torch.ops.diyflash.attention(q, k, v)
        c = torch.ops.diyflash.matmul(q[0, 0], k[0, 0].mT)
    assert out.dtype == c.dtype == torch.float64


@pytest.mark.parametrize("amp", AMP)
def test_gradients_reach_fp32_leaves(device, amp):
    """A training step under autocast: gradients of fp32 parameters are fp32, and equal those of the same
    step written with explicit casts."""
    q, k, v = make_qkv(1, 2, 17, 17, 16, torch.float32, device, requires_grad=True)
    with _autocast(device, amp):
        out = diyflash.flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    low = [t.detach().to(amp).requires_grad_() for t in (q, k, v)]
    out_low = diyflash.flash_attention(*low, causal=True)
    expected = torch.autograd.grad(out_low.float().square().sum(), low)
    for g, e in zip(grads, expected):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, e.float(), rtol=0, atol=0)


@pytest.mark.parametrize("amp", AMP)
def test_compiled_equals_eager_under_autocast(device, amp):
    """The fakes see the cast inputs, so a compiled graph has the eager dtypes (matmul's fake had said
    fp32 while its eager result was bf16) and the same values, with no graph break."""
    q, k, v = make_qkv(1, 2, 17, 17, 16, torch.float32, device)
    w = torch.randn(16, 24, device=device)

    def f(q, k, v, w):
        with torch.autocast(device.type, dtype=amp):
            o = torch.ops.diyflash.attention(q, k, v, causal=True)
            return o, torch.ops.diyflash.matmul(o[0, 0], w.to(o.dtype))

    explain = torch._dynamo.explain(f)(q, k, v, w)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    eager = f(q, k, v, w)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, w)
    for e, c in zip(eager, compiled):
        assert e.dtype == c.dtype == amp
        torch.testing.assert_close(c, e, rtol=0, atol=0)
