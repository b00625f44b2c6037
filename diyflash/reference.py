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
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    diagonal_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with diyflash's exact semantics, returning (out, lse), written densely and directly
    from the contract (not from the kernels' code).

    q: (..., H, N_q, D); k: (..., H_kv, N_k, D), v: (..., H_kv, N_k, D_v); H_kv divides H and query head
    h reads kv head h // (H / H_kv) (k and v are repeated here: this is the oracle, not the kernel).
    3-D inputs (BH, N, D) need H = H_kv. upcast=True computes in float64 (the oracle); upcast=False
    computes like plain PyTorch in the inputs' dtype (scores and p @ v in that dtype, softmax accumulated
    in fp32 by torch.softmax), which is the "plain PyTorch error" baseline of the tests.
    Scores s = scale * q.k; softcap > 0: s = softcap * tanh(s / softcap); ALiBi (slopes (H,) or (B, H)):
    s -= slope * |i + N_k - N_q - j|. Masks: causal: j <= i + N_k - N_q (bottom-right); window (left,
    right), -1 unbounded: i + off - left <= j <= i + off + right; seq_lens (B,): keys j >= L ignored,
    rows i >= L output 0 with lse = -inf. sinks (H,): one more logit per head in the denominator,
    carrying no value. Rows that see no key output 0, with lse = -inf (the sink, with sinks).
    diagonal_offset: off = N_k - N_q + diagonal_offset in the masks and ALiBi's distance (query row i sits
    at key position i + off).
    """
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    if k.dim() == 4 and k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(n_q, device=q.device).view(n_q, 1)
    cols = torch.arange(n_k, device=q.device).view(1, n_k)
    diag = rows + (n_k - n_q + diagonal_offset)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(scores.dtype)
        slopes = slopes.view(1, -1, 1, 1) if slopes.dim() == 1 else slopes.view(slopes.shape[0], -1, 1, 1)
        scores = scores - slopes * (diag - cols).abs().to(scores.dtype)
    visible = visible_mask(n_q, n_k, causal, window_size, diagonal_offset, q.device)
    shape = (-1,) + (1,) * (q.dim() - 1)  # (B, 1, ..., 1): one length per leading index
    row_valid = torch.ones(n_q, 1, dtype=torch.bool, device=q.device)
    if seq_lens is not None:
        valid = seq_lens.to(q.device, torch.long).view(shape)
        visible = visible & (cols < valid) & (rows < valid)
        row_valid = rows < valid
    visible = visible.expand(scores.shape)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:  # one more column: the sink's logit, always visible, value 0
        sink_col = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_col], -1)
        visible = torch.cat([visible, visible.new_ones(*visible.shape[:-1], 1)], -1)  # also with no key
        v = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1]).expand(*scores.shape[:-2], 1, v.shape[-1])], -2)
    any_visible = visible.any(-1, keepdim=True) & row_valid
    lse = torch.logsumexp(scores.float() if not upcast else scores, dim=-1)
    lse = lse.masked_fill(~any_visible.squeeze(-1), float("-inf"))
    # rows that see no key: softmax over zeros (finite), then multiplied by 0, so no NaN reaches autograd.
    # A sink of +inf holds all of its row's mass (lse +inf): its probability is 1, not inf - inf
    probs_of = scores.clamp(max=torch.finfo(scores.dtype).max) if sinks is not None else scores
    p = torch.softmax(torch.where(any_visible, probs_of, 0.0), dim=-1) * any_visible
    out = torch.matmul(p.to(v.dtype), v)
    return out, lse


def visible_mask(n_q: int, n_k: int, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                 diagonal_offset: int = 0, device=None) -> torch.Tensor:
    """(N_q, N_k) bool: whether query row i sees key j, by the contract's definition: i sits at key position
    i + N_k - N_q + diagonal_offset; causal keeps keys up to it, a window (left, right) the keys within
    left before and right after it (-1: that side unbounded)."""
    diag = torch.arange(n_q, device=device).view(n_q, 1) + (n_k - n_q + diagonal_offset)
    cols = torch.arange(n_k, device=device).view(1, n_k)
    visible = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    left, right = window_size
    if causal:
        visible = visible & (cols <= diag)
    if left >= 0:
        visible = visible & (cols >= diag - left)
    if right >= 0:
        visible = visible & (cols <= diag + right)
    return visible


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The seed's reference: softmax(q k^T / sqrt(head_dim)) v in plain PyTorch.

    q: (..., N_q, D), k and v: (..., N_k, D), any shapes torch.matmul accepts. Computed in float32
    (float64 for float64 inputs) and returned in q's dtype. causal uses the same bottom-right alignment
    as flash_attention when N_q != N_k; a row that sees no key outputs 0.
    """
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    out, _ = attention_ref(q.to(compute), k.to(compute), v.to(compute), causal=causal, upcast=False)
    return out.to(q.dtype)


def attention_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    upcast: bool = True,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences by the definition: attention_ref on each sequence alone, concatenated. q (T_q, H,
    D), k (T_k, H_kv, D), v (T_k, H_kv, D_v), cu_seqlens (B + 1,); alibi_slopes (H,) or (B, H). Returns
    out (T_q, H, D_v) and lse (H, T_q). A loop over the sequences on the host: the oracle, not a kernel."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qb = q[cu_q[b]:cu_q[b + 1]].transpose(0, 1).unsqueeze(0)
        kb = k[cu_k[b]:cu_k[b + 1]].transpose(0, 1).unsqueeze(0)
        vb = v[cu_k[b]:cu_k[b + 1]].transpose(0, 1).unsqueeze(0)
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]
        out, lse = attention_ref(qb, kb, vb, causal, scale, None, upcast, window_size=window_size, softcap=softcap,
                                 alibi_slopes=slopes, sinks=sinks)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)
