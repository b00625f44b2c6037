"""The attention algorithm of attention.py in plain PyTorch, blocked over keys.

Serves CPU tensors when Triton's interpreter is off (so models trace, export and run on CPU-only
machines) and float64 anywhere (gradcheck). Same semantics as the Triton kernels (see attention.py's
docstring): bottom-right causal alignment, seq_lens, lse = -inf and output 0 for rows that see no key.
Memory is O(N_q * BLOCK_N) per (batch, head): no N_q x N_k buffer for the whole sequence.
"""

from __future__ import annotations

import torch

BLOCK_N = 128


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(1) if t.dim() == 3 else t


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _limits(seq_lens: torch.Tensor | None, z: int, n_q: int, n_k: int, device):
    """Per-batch (q_len, kv_len), shaped (Z, 1, 1, 1) for broadcasting against (Z, H, rows, cols)."""
    if seq_lens is None:
        q_len = torch.full((z, 1, 1, 1), n_q, device=device)
        kv_len = torch.full((z, 1, 1, 1), n_k, device=device)
    else:
        valid = seq_lens.to(device=device, dtype=torch.long).clamp(min=0).view(z, 1, 1, 1)
        q_len, kv_len = valid.clamp(max=n_q), valid.clamp(max=n_k)
    return q_len, kv_len


def _visible(rows, cols, q_len, kv_len, causal: bool, causal_offset: int) -> torch.Tensor:
    """(Z, 1, rows, cols) bool: key col is visible to query row."""
    vis = (cols < kv_len) & (rows < q_len)
    if causal:
        vis = vis & (cols <= rows + causal_offset)
    return vis


def _key_block(q4, k4, v4, n0: int, block_n: int, acc_t, scale: float):
    """Keys [n0, n0 + block_n): their k and v in the accumulation dtype, their positions (1, 1, 1, n)
    and the scaled scores q k^T (Z, H, N_q, n)."""
    kb = k4[:, :, n0 : n0 + block_n].to(acc_t)
    vb = v4[:, :, n0 : n0 + block_n].to(acc_t)
    cols = torch.arange(n0, n0 + kb.shape[2], device=q4.device).view(1, 1, 1, -1)
    return kb, vb, cols, torch.matmul(q4, kb.transpose(-1, -2)) * scale


def attention_fwd_blocked(q, k, v, causal: bool, scale: float, seq_lens, block_n: int = BLOCK_N):
    acc_t = _acc_dtype(q.dtype)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=acc_t, device=q.device)
    if out.numel() == 0:
        return out, lse
    q4, k4, v4 = _as_4d(q).to(acc_t), _as_4d(k), _as_4d(v)
    z, h, n_q, _ = q4.shape
    n_k = k4.shape[2]
    q_len, kv_len = _limits(seq_lens, z, n_q, n_k, q.device)
    rows = torch.arange(n_q, device=q.device).view(1, 1, n_q, 1)

    m = torch.full((z, h, n_q), float("-inf"), dtype=acc_t, device=q.device)
    l = torch.zeros((z, h, n_q), dtype=acc_t, device=q.device)
    acc = torch.zeros(q4.shape, dtype=acc_t, device=q.device)
    for n0 in range(0, n_k, block_n):
        kb, vb, cols, s = _key_block(q4, k4, v4, n0, block_n, acc_t, scale)
        s = s.masked_fill(~_visible(rows, cols, q_len, kv_len, causal, n_k - n_q), float("-inf"))
        # -- online softmax update (a row with no visible key keeps m = -inf and gets p = 0) --
        m_new = torch.maximum(m, s.amax(-1))
        m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)
        p = torch.exp(s - m_sub.unsqueeze(-1))
        alpha = torch.exp(m - m_sub)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vb)
        m = m_new
    live = l > 0
    l_safe = torch.where(live, l, 1.0)
    out4 = torch.where(live.unsqueeze(-1), acc / l_safe.unsqueeze(-1), 0.0)
    lse4 = torch.where(live, m + torch.log(l_safe), float("-inf"))
    out.copy_(out4 if q.dim() == 4 else out4.squeeze(1))
    lse.copy_(lse4 if q.dim() == 4 else lse4.squeeze(1))
    return out, lse


def attention_bwd_blocked(dout, dlse, q, k, v, out, lse, causal: bool, scale: float, seq_lens,
                          block_n: int = BLOCK_N):
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    acc_t = _acc_dtype(q.dtype)
    q4, k4, v4 = _as_4d(q).to(acc_t), _as_4d(k), _as_4d(v)
    g4, o4 = _as_4d(dout).to(acc_t), _as_4d(out).to(acc_t)
    z, h, n_q, _ = q4.shape
    n_k = k4.shape[2]
    lse4 = _as_4d(lse.unsqueeze(-1)).squeeze(-1).to(acc_t)
    delta = (g4 * o4).sum(-1)
    if dlse is not None:
        delta = delta - _as_4d(dlse.unsqueeze(-1)).squeeze(-1).to(acc_t)
    lse4 = torch.where(lse4 == float("-inf"), float("inf"), lse4)  # rows that saw no key: p = 0
    q_len, kv_len = _limits(seq_lens, z, n_q, n_k, q.device)
    rows = torch.arange(n_q, device=q.device).view(1, 1, n_q, 1)

    dq4 = torch.zeros(q4.shape, dtype=acc_t, device=q.device)
    dk4 = torch.zeros(k4.shape, dtype=acc_t, device=q.device)
    dv4 = torch.zeros(v4.shape, dtype=acc_t, device=q.device)
    for n0 in range(0, n_k, block_n):
        kb, vb, cols, s = _key_block(q4, k4, v4, n0, block_n, acc_t, scale)
        p = torch.exp(s - lse4.unsqueeze(-1))
        p = torch.where(_visible(rows, cols, q_len, kv_len, causal, n_k - n_q), p, 0.0)
        dv4[:, :, n0 : n0 + block_n] = torch.matmul(p.transpose(-1, -2), g4)
        ds = p * (torch.matmul(g4, vb.transpose(-1, -2)) - delta.unsqueeze(-1))
        dq4 += torch.matmul(ds, kb) * scale
        dk4[:, :, n0 : n0 + block_n] = torch.matmul(ds.transpose(-1, -2), q4) * scale
    for dst, src in ((dq, dq4), (dk, dk4), (dv, dv4)):
        dst.copy_(src if dst.dim() == 4 else src.squeeze(1))
    return dq, dk, dv
