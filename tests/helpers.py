"""One seeded input factory for every test (numerics, opcheck, compile, export). The error rule lives
in diyflash.utils.validation, shared with `python -m diyflash`."""

from __future__ import annotations

import torch

from conftest import DEVICE

ON_GPU = DEVICE == "cuda"
# bf16 runs on CPU too: under the interpreter its tiles are widened to fp32 before tl.dot
# (triton-lang/triton#11584), so bf16 numerics that matter are the GPU suite's.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def make_qkv(
    b: int,
    h: int,
    n_q: int,
    n_k: int,
    d: int,
    dtype: torch.dtype = torch.float16,
    device: torch.device | str = DEVICE,
    layout: str = "bhnd",
    requires_grad: bool = False,
    seed: int = 0,
):
    """q (b, h, n_q, d), k and v (b, h, n_k, d), drawn from a seeded generator.

    layout: "bhnd" contiguous; "bnhd" a (b, h, n, d) view of (b, n, h, d) storage (non-contiguous,
    read in place by the kernels); "3d" (b*h, n, d); "sliced" a view of a wider head_dim buffer
    (non-dense: rows are strided past the data).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def one(n: int) -> torch.Tensor:
        if layout == "bnhd":
            t = torch.randn(b, n, h, d, generator=gen).to(device=device, dtype=dtype).transpose(1, 2)
        elif layout == "3d":
            t = torch.randn(b * h, n, d, generator=gen).to(device=device, dtype=dtype)
        elif layout == "sliced":
            t = torch.randn(b, h, n, d + 8, generator=gen).to(device=device, dtype=dtype)[..., :d]
        else:
            assert layout == "bhnd", layout
            t = torch.randn(b, h, n, d, generator=gen).to(device=device, dtype=dtype)
        return t.requires_grad_(requires_grad)

    return one(n_q), one(n_k), one(n_k)


def random_like(t: torch.Tensor, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(t.shape, generator=gen).to(device=t.device, dtype=t.dtype)


def copies_of(fn, *tensors) -> list[str]:
    """aten copy/clone/contiguous calls made while running fn whose input has the shape of one of
    `tensors`: a silent full copy of an operand. (Triton's interpreter copies every argument's storage
    in and out as flat byte buffers; those are 1-D and not counted.)"""
    shapes = {tuple(t.shape) for t in tensors}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    names = ("aten::contiguous", "aten::clone", "aten::copy_", "aten::_to_copy")
    return [f"{e.name}{e.input_shapes}" for e in prof.events()
            if e.name in names and any(tuple(s) in shapes for s in e.input_shapes if s)]


def slopes(h, b=None, device="cpu"):
    """ALiBi slopes (h,), or (b, h) scaled per batch row: the variants' and varlen tests' one recipe."""
    base = torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)])
    return (base if b is None else base * torch.linspace(0.5, 1.5, b)[:, None]).to(device)


def sink_logits(h, device="cpu"):
    """Seeded sink logits (h,)."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    return torch.randn(h, generator=gen).to(device)


def opcheck_backward(fwd, bwd, args):
    """opcheck ALL of a backward op (attention_bwd, attention_varlen_bwd) on its forward op's outputs for
    args (the forward's arguments), without and with a gradient of lse."""
    out, lse = fwd(*args)
    gen = torch.Generator(device="cpu").manual_seed(3)
    dout = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    dlse = torch.randn(lse.shape, generator=gen).to(lse.device)
    for dl in (None, dlse):
        torch.library.opcheck(bwd, (dout, dl, *args[:3], out, lse, *args[3:]), test_utils="ALL")


def cancellation_bands(q, k, v, dout, scale: float) -> dict:
    """Rounding bands for dq, dk (dv: 0) at the scale of their terms, for where plain autograd is exact
    by algebra and FlashAttention is not: ds = p (dp - delta) cancels two fp32 sums of ~|dp| taken in
    different orders (~eps |dp| each), and dq = scale ds k, dk = scale ds^T q sum many such terms (over
    keys, or over rows and a GQA group's heads). 64 fp32 ulps of scale |dp| |k| or |q|: room for ~4 ulps
    per term over a random walk of 256 terms. (B, H, N, D) inputs, k and v with H_kv heads."""
    group = q.shape[-3] // k.shape[-3] if q.dim() == 4 else 1
    v_q = v.double().repeat_interleave(group, dim=-3) if group > 1 else v.double()
    dp = (dout.double() @ v_q.transpose(-1, -2)).abs().max().item()
    eps = 64 * torch.finfo(torch.float32).eps * scale * dp
    return {"dq": eps * k.double().abs().max().item(), "dk": eps * q.double().abs().max().item(), "dv": 0.0}


def _attention_op(q, k, v, causal, scale, seq_lens):
    return torch.ops.diyflash.attention(q, k, v, causal=causal, scale=scale, seq_lens=seq_lens)


def check_attention(q, k, v, causal, scale=None, seq_lens=None, grad=True):
    """Run diyflash's op and both references; assert the error rule on out and (optionally) dq, dk, dv."""
    from diyflash.utils.validation import attention_error_reports

    out, grads, reports = attention_error_reports(_attention_op, q, k, v, causal, scale, seq_lens, grad=grad)
    assert out.dtype == q.dtype and out.shape == q.shape
    for g, t in zip(grads or (), (q, k, v)):
        assert g.dtype == t.dtype and g.shape == t.shape
    for report in reports:
        assert report.ok, str(report)
    return out
