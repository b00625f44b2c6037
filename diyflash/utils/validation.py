"""Checking a kernel against the float64 oracle with flash-attn's rule (used by the tests and by
`python -m diyflash`).

Rule: |kernel - oracle| <= 2 * |plain PyTorch in the kernel's dtype - oracle| + rounding band.
"""

from __future__ import annotations

import math
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


def compare_with_oracle(fn, reference, inputs, out_name, grad_names, grad=True, dout=None, seed=1):
    """Run fn(*inputs), reference(*inputs in float64, upcast=True) (the oracle) and
    reference(*inputs, upcast=False) (plain PyTorch in the inputs' dtype); with grad, backpropagate one
    seeded gradient through all three. Returns (out, grads or None, [ErrorReport, ...]).
    The caller's tensors are not modified (requires_grad is set on detached aliases)."""
    inputs = [t.detach().requires_grad_(grad) for t in inputs]
    out = fn(*inputs)
    leaves64 = [t.detach().double().requires_grad_(grad) for t in inputs]
    plain_leaves = [t.detach().clone().requires_grad_(grad) for t in inputs]
    ref = reference(*leaves64, upcast=True)
    plain = reference(*plain_leaves, upcast=False)
    reports = [error_report(out_name, out, ref, plain)]
    got = None
    if grad:
        if dout is None:
            gen = torch.Generator(device="cpu").manual_seed(seed)
            dout = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
        got = torch.autograd.grad(out, inputs, dout)
        want = torch.autograd.grad(ref, leaves64, dout.double())
        base = torch.autograd.grad(plain, plain_leaves, dout)
        reports += [error_report(n, a, r, p) for n, a, r, p in zip(grad_names, got, want, base)]
    return out, got, reports


def attention_error_reports(fn, q, k, v, causal=False, scale=None, seq_lens=None, grad=True, dout=None):
    """fn(q, k, v, causal, scale, seq_lens) against attention_ref: reports for out (and dq, dk, dv)."""
    return compare_with_oracle(
        lambda q, k, v: fn(q, k, v, causal, scale, seq_lens),
        lambda q, k, v, upcast: attention_ref(q, k, v, causal=causal, scale=scale, seq_lens=seq_lens, upcast=upcast)[0],
        (q, k, v), "out", ("dq", "dk", "dv"), grad=grad, dout=dout, seed=1)


def matmul_error_reports(fn, a, b, grad=True, dout=None):
    """fn(a, b) against a @ b: reports for c (and da, db)."""
    return compare_with_oracle(fn, lambda a, b, upcast: a @ b, (a, b), "c", ("da", "db"),
                               grad=grad, dout=dout, seed=3)


# ---- the seed's validators: tolerance checks against PyTorch, returning (ok, max_diff) -------------------


def _within_tolerance(name: str, out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float,
                      verbose: bool) -> tuple[bool, float]:
    """(ok, max |out - ref|): a wrong shape, NaN or anything outside allclose(rtol, atol) fails."""
    if out.shape != ref.shape:
        ok, max_diff = False, float("inf")
    else:
        got = out.to(ref.dtype)
        max_diff = (got - ref).abs().max().item() if ref.numel() else 0.0
        ok = bool(torch.allclose(got, ref, rtol=rtol, atol=atol)) and not bool(torch.isnan(got).any())
    if verbose:
        print(f"{name}: {'PASSED' if ok else 'FAILED'} (max |diff| {max_diff:.3e}, rtol {rtol}, atol {atol})")
    return ok, max_diff


def validate_matmul(triton_fn, m: int, n: int, k: int, rtol: float = 1e-3, atol: float = 1e-3,
                    dtype: torch.dtype = torch.float16, device: str = "cuda", verbose: bool = False):
    """Compare triton_fn(a, b) with torch.matmul on the same inputs, computed in float32 (float64 for
    float32 inputs) so that the reference carries no rounding of its own. Inputs are N(0, 1) scaled by
    1/sqrt(k) so the outputs are O(1) and rtol/atol mean the same at every k. Returns (ok, max_diff)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = (torch.randn(m, k, generator=gen) / math.sqrt(max(k, 1))).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=gen).to(device=device, dtype=dtype)
    ref_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    ref = torch.matmul(a.to(ref_dtype), b.to(ref_dtype))
    return _within_tolerance(f"matmul {m}x{k} @ {k}x{n} {dtype}", triton_fn(a, b), ref, rtol, atol, verbose)


def validate_attention(flash_fn, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = False,
                       rtol: float = 1e-3, atol: float = 1e-3, dtype: torch.dtype = torch.float16,
                       device: str = "cuda", verbose: bool = False):
    """Compare flash_fn(q, k, v, causal=causal) with PyTorch's scaled_dot_product_attention on the same
    inputs upcast to float32 (float64 for float32 inputs). Returns (ok, max_diff). The defaults suit
    fp16 and fp32; bf16 keeps 8 mantissa bits, so give it rtol = atol = 1e-2."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=gen).to(device=device, dtype=dtype)
               for _ in range(3))
    ref_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.to(ref_dtype), k.to(ref_dtype), v.to(ref_dtype), is_causal=causal)
    return _within_tolerance(f"attention {tuple(q.shape)} causal={causal} {dtype}",
                             flash_fn(q, k, v, causal=causal), ref, rtol, atol, verbose)


def variants_cell(device, dtype: torch.dtype, d: int, n: int, gen: torch.Generator):
    """The main job's cell with every variant at once: GQA 4/2, D_v = D/2 (at least 8), a causal window of
    n/4 keys, softcap 20, per-head ALiBi slopes and sinks, N_k = N_q + 5. Returns (q, k, v, sinks, kw):
    causal diyflash.flash_attention with kw's window_size (its left side; the right one -1), softcap and
    alibi_slopes, and the sinks (variants_call makes it). `python -m diyflash` validates it, and
    its precompile step compiles the same call (shapes pick kernel variants, so both build it here)."""
    dv = max(8, d // 2 // 8 * 8)
    q = torch.randn(1, 4, n, d, generator=gen).to(device, dtype)
    k = torch.randn(1, 2, n + 5, d, generator=gen).to(device, dtype)
    v = torch.randn(1, 2, n + 5, dv, generator=gen).to(device, dtype)
    sinks = torch.randn(4, generator=gen).to(device)
    kw = dict(window_size=(max(1, n // 4), -1), softcap=20.0,
              alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device))
    return q, k, v, sinks, kw


def variants_call(q, k, v, sinks, kw) -> torch.Tensor:
    """The variants cell's attention (variants_cell's kw), through the public call (as the main job's
    other cells: it does not import torch._dynamo, as the op's first call by name does)."""
    import diyflash

    return diyflash.flash_attention(q, k, v, True, window_size=(kw["window_size"][0], -1), softcap=kw["softcap"],
                                    alibi_slopes=kw["alibi_slopes"], sinks=sinks)
