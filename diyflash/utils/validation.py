"""Checking a kernel against the float64 oracle with flash-attn's rule (used by the tests and by
`python -m diyflash`).

Rule: |kernel - oracle| <= 2 * |plain PyTorch in the kernel's dtype - oracle| + rounding band.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..reference import attention_ref


@dataclass(frozen=True)
class ErrorReport:
    name: str
    err: float  # max |kernel - oracle|
    plain_err: float  # max |plain PyTorch (same dtype) - oracle|
    band: float
    has_nan: bool

    @property
    def bound(self) -> float:
        return 2 * self.plain_err + self.band

    @property
    def ok(self) -> bool:
        return not self.has_nan and self.err <= self.bound

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        nan = " (NaN!)" if self.has_nan else ""
        return (f"{self.name}: kernel error {self.err:.3e}{nan} vs bound {self.bound:.3e} "
                f"(2 x plain PyTorch {self.plain_err:.3e} + band {self.band:.3e}) {verdict}")


def rounding_band(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The rounding band added to the 2x rule, at the scale max(|ref|, 1).

    One ulp of the output dtype, plus 32 ulps of fp32 for the kernel's fp32 accumulators, which sum in
    another order than PyTorch. The second term matters where PyTorch is exact by algebra: with a
    single key, plain autograd's dq is g - g = 0 exactly, while FlashAttention's dp - delta cancels two
    differently ordered fp32 sums of ~10 and leaves ~1e-6.
    """
    scale = max(ref.abs().max().item(), 1.0) if ref.numel() else 1.0
    return (torch.finfo(dtype).eps + 32 * torch.finfo(torch.float32).eps) * scale


def error_report(name: str, got: torch.Tensor, ref: torch.Tensor, plain: torch.Tensor) -> ErrorReport:
    if got.numel() == 0:
        return ErrorReport(name, 0.0, 0.0, 0.0, False)
    return ErrorReport(
        name=name,
        err=(got.double() - ref).abs().max().item(),
        plain_err=(plain.double() - ref).abs().max().item(),
        band=rounding_band(ref, got.dtype),
        has_nan=bool(torch.isnan(got).any()),
    )


def attention_error_reports(fn, q, k, v, causal=False, scale=None, seq_lens=None, grad=True, dout=None):
    """Run fn(q, k, v, causal, scale, seq_lens) and both references.

    Returns (out, grads, reports): grads = (dq, dk, dv) or None, reports for out (and dq, dk, dv).
    The caller's q, k, v are not modified (requires_grad is set on detached aliases).
    """
    q, k, v = (t.detach().requires_grad_(grad) for t in (q, k, v))
    out = fn(q, k, v, causal, scale, seq_lens)
    leaves64 = [t.detach().double().requires_grad_(grad) for t in (q, k, v)]
    ref, _ = attention_ref(*leaves64, causal=causal, scale=scale, seq_lens=seq_lens, upcast=True)
    plain_leaves = [t.detach().clone().requires_grad_(grad) for t in (q, k, v)]
    plain, _ = attention_ref(*plain_leaves, causal=causal, scale=scale, seq_lens=seq_lens, upcast=False)
    reports = [error_report("out", out, ref, plain)]
    got = None
    if grad:
        if dout is None:
            gen = torch.Generator(device="cpu").manual_seed(1)
            dout = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
        got = torch.autograd.grad(out, (q, k, v), dout)
        want = torch.autograd.grad(ref, leaves64, dout.double())
        base = torch.autograd.grad(plain, plain_leaves, dout)
        reports += [error_report(n, a, r, p) for n, a, r, p in zip(("dq", "dk", "dv"), got, want, base)]
    return out, got, reports
