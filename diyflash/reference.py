"""Plain PyTorch attention: the oracle the kernels are checked against.

It materialises the full (N_q, N_k) score matrix, so it is for validation on modest sizes only.
Tests, benchmarks and the main job import it; diyflash.ops and diyflash.kernels never do.
"""

from __future__ import annotations

import math

import torch


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    seq_lens: torch.Tensor | None = None,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with diyflash's exact semantics, returning (out, lse).

    q: (..., N_q, D); k, v: (..., N_k, D), with any leading dims torch.matmul broadcasts.
    upcast=True computes in float64 (the oracle); upcast=False computes like plain PyTorch in the
    inputs' dtype (scores and p @ v in that dtype, softmax accumulated in fp32 by torch.softmax),
    which is the "plain PyTorch error" baseline of the tests.
    causal: query i sees key j iff j <= i + N_k - N_q (bottom-right). seq_lens (B,) with B = q.shape[0]:
    keys j >= L ignored, rows i >= L output 0. Rows that see no key output 0 with lse = -inf.
    """
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    rows = torch.arange(n_q, device=q.device).view(n_q, 1)
    cols = torch.arange(n_k, device=q.device).view(1, n_k)
    visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        visible = cols <= rows + (n_k - n_q)
    if seq_lens is not None:
        shape = (-1,) + (1,) * (q.dim() - 1)  # (B, 1, ..., 1): one length per leading index
        valid = seq_lens.to(q.device, torch.long).view(shape)
        visible = visible & (cols < valid) & (rows < valid)
    visible = visible.expand(scores.shape)
    any_visible = visible.any(-1, keepdim=True)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores.float() if not upcast else scores, dim=-1)
    # rows that see no key: softmax over zeros (finite), then multiplied by 0, so no NaN reaches autograd
    p = torch.softmax(torch.where(any_visible, scores, 0.0), dim=-1) * any_visible
    out = torch.matmul(p.to(v.dtype), v)
    return out, lse


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The seed's reference: softmax(q k^T / sqrt(head_dim)) v in plain PyTorch.

    q: (..., N_q, D), k and v: (..., N_k, D), any shapes torch.matmul accepts. Computed in float32
    (float64 for float64 inputs) and returned in q's dtype. causal uses the same bottom-right alignment
    as flash_attention when N_q != N_k; a row that sees no key outputs 0.
    """
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    out, _ = attention_ref(q.to(compute), k.to(compute), v.to(compute), causal=causal, upcast=False)
    return out.to(q.dtype)
