"""The attention algorithm of kernels/attention in plain PyTorch, blocked over keys.

Serves CPU tensors when Triton's interpreter is off (so models trace, export and run on CPU-only
machines) and float64 anywhere (gradcheck). Same semantics as the Triton kernels, function for function
with kernels/attention/semantics.py: `_scores` (scale, softcap, ALiBi), `_visible` (key length, causal,
window), `band` (how a window's sides are normalised); bottom-right alignment, seq_lens, sinks, GQA,
D_v != D, lse = -inf and output 0 for rows that see no key (lse = the sink for a row with a sink).
Memory is O(N_q * BLOCK_N) per (batch, head): no N_q x N_k buffer for the whole sequence. GQA reads k
and v through broadcasting views: no copy, no repeat.
"""

from __future__ import annotations

import torch

BLOCK_N = 128


def band(causal: bool, window: tuple[int, int], n_q: int, n_k: int) -> tuple[bool, bool, int, int]:
    """(causal, bounded, left, right) as every implementation applies them: a non-causal window whose
    right side is 0 is causal; causal caps right at 0; an unbounded side (-1) becomes N_q + N_k, which no
    distance reaches; `bounded` says whether any side still bounds."""
    left, right = window
    if right == 0 and not causal:
        causal = True
    unbounded = n_q + n_k
    bounded = left >= 0 or (right >= 0 and not causal)
    left = unbounded if left < 0 else min(left, unbounded)
    right = 0 if causal else unbounded if right < 0 else min(right, unbounded)
    return causal, bounded, left, right


def empty_out(q: torch.Tensor, dv: int) -> torch.Tensor:
    """The output (..., N_q, D_v) in q's memory layout: torch.empty_like(q) when D_v = D, else the
    same dimension order. Every path and the ops' fakes allocate it here, so their strides agree."""
    if q.shape[-1] == dv:
        return torch.empty_like(q)
    order = sorted(range(q.dim()), key=lambda i: -q.stride(i))  # q's dims, outermost first
    shape = (*q.shape[:-1], dv)
    dense = torch.empty([shape[i] for i in order], dtype=q.dtype, device=q.device)
    return dense.permute([order.index(i) for i in range(q.dim())])


def _as_5d(t: torch.Tensor, groups: int) -> torch.Tensor:
    """(Z, H, N, D) -> (Z, H / groups, groups, N, D) view ((BH, N, D) as H = 1)."""
    t = t.unsqueeze(1) if t.dim() == 3 else t
    return t.unflatten(1, (t.shape[1] // groups, groups))


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _limits(seq_lens: torch.Tensor | None, z: int, n_q: int, n_k: int, device):
    """Per-batch (q_len, kv_len), shaped (Z, 1, 1, 1, 1) for broadcasting against (Z, Hkv, G, rows, cols)."""
    if seq_lens is None:
        q_len = torch.full((z, 1, 1, 1, 1), n_q, device=device)
        kv_len = torch.full((z, 1, 1, 1, 1), n_k, device=device)
    else:
        valid = seq_lens.to(device=device, dtype=torch.long).clamp(min=0).view(z, 1, 1, 1, 1)
        q_len, kv_len = valid.clamp(max=n_q), valid.clamp(max=n_k)
    return q_len, kv_len


def _visible(rows, cols, q_len, kv_len, causal: bool, causal_offset: int, bounded: bool, left: int, right: int):
    """Bool, broadcast of (rows, cols): key col is visible to query row (semantics._visible)."""
    vis = (cols < kv_len) & (rows < q_len)
    diag = rows + causal_offset
    if causal:
        vis = vis & (cols <= diag)
    if bounded:
        vis = vis & (cols >= diag - left) & (cols <= diag + right)
    return vis


def _scores(qk, rows, cols, causal_offset: int, scale: float, softcap: float, slopes):
    """Scores of raw q.k (semantics._scores, in natural units): scaled, softcapped, ALiBi-biased.
    Returns (s, t), t the softcap's tanh (None without softcap)."""
    s = qk * scale
    t = None
    if softcap > 0:
        t = torch.tanh(s / softcap)
        s = softcap * t
    if slopes is not None:
        s = s - slopes * (rows + causal_offset - cols).abs().to(s.dtype)
    return s, t


def _per_head(t: torch.Tensor | None, h_kv: int, groups: int, acc_t) -> torch.Tensor | None:
    """ALiBi slopes (H,) or (Z, H) -> (Z or 1, Hkv, G, 1, 1) in the accumulation dtype."""
    if t is None:
        return None
    t = t.to(acc_t)
    return t.reshape(-1, h_kv, groups, 1, 1)


def _key_block(q5, k5, v5, n0: int, block_n: int, acc_t):
    """Keys [n0, n0 + block_n): their k and v in the accumulation dtype, their positions and the raw dots."""
    kb = k5[..., n0 : n0 + block_n, :].to(acc_t)
    vb = v5[..., n0 : n0 + block_n, :].to(acc_t)
    cols = torch.arange(n0, n0 + kb.shape[-2], device=q5.device).view(1, 1, 1, 1, -1)
    return kb, vb, cols, torch.matmul(q5, kb.transpose(-1, -2))


def _groups(q, k) -> int:
    return (q.shape[1] // k.shape[1]) if q.dim() == 4 else 1


def attention_fwd_blocked(q, k, v, causal: bool, scale: float, seq_lens, block_n: int = BLOCK_N, *,
                          window=(-1, -1), softcap: float = 0.0, alibi_slopes=None, sinks=None):
    acc_t = _acc_dtype(q.dtype)
    g = _groups(q, k)
    out = empty_out(q, v.shape[-1])
    lse = torch.empty(q.shape[:-1], dtype=acc_t, device=q.device)
    if out.numel() == 0:
        return out, lse
    q5, k5, v5 = _as_5d(q, g).to(acc_t), _as_5d(k, 1), _as_5d(v, 1)
    z, h_kv, _, n_q, _ = q5.shape
    n_k = k5.shape[-2]
    causal, bounded, left, right = band(causal, window, n_q, n_k)
    q_len, kv_len = _limits(seq_lens, z, n_q, n_k, q.device)
    rows = torch.arange(n_q, device=q.device).view(1, 1, 1, n_q, 1)
    slopes = _per_head(alibi_slopes, h_kv, g, acc_t)

    stats = (z, h_kv, g, n_q)
    if sinks is None:
        m = torch.full(stats, float("-inf"), dtype=acc_t, device=q.device)
        l = torch.zeros(stats, dtype=acc_t, device=q.device)
    else:  # the sink starts every row: max = sink, sum = 1
        m = sinks.to(acc_t).view(1, h_kv, g, 1).expand(stats).clone()
        l = torch.ones(stats, dtype=acc_t, device=q.device)
    acc = torch.zeros((*stats, v.shape[-1]), dtype=acc_t, device=q.device)
    for n0 in range(0, n_k, block_n):
        kb, vb, cols, qk = _key_block(q5, k5, v5, n0, block_n, acc_t)
        s, _ = _scores(qk, rows, cols, n_k - n_q, scale, softcap, slopes)
        s = s.masked_fill(~_visible(rows, cols, q_len, kv_len, causal, n_k - n_q, bounded, left, right), float("-inf"))
        # -- online softmax update (a row with no visible key keeps m = -inf and gets p = 0) --
        m_new = torch.maximum(m, s.amax(-1))
        m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)
        p = torch.exp(s - m_sub.unsqueeze(-1))
        alpha = torch.exp(m - m_sub)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vb)
        m = m_new
    live = (l > 0) & (rows.squeeze(-1) < q_len.squeeze(-1))
    l_safe = torch.where(live, l, 1.0)
    out5 = torch.where(live.unsqueeze(-1), acc / l_safe.unsqueeze(-1), 0.0)
    lse5 = torch.where(live, m + torch.log(l_safe), float("-inf"))
    out.copy_(out5.flatten(1, 2) if q.dim() == 4 else out5.flatten(1, 3))
    lse.copy_(lse5.flatten(1, 2) if q.dim() == 4 else lse5.flatten(1, 3))
    return out, lse


def attention_bwd_blocked(dout, dlse, q, k, v, out, lse, causal: bool, scale: float, seq_lens,
                          block_n: int = BLOCK_N, *, window=(-1, -1), softcap: float = 0.0, alibi_slopes=None):
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    acc_t = _acc_dtype(q.dtype)
    g = _groups(q, k)
    q5, k5, v5 = _as_5d(q, g).to(acc_t), _as_5d(k, 1), _as_5d(v, 1)
    g5, o5 = _as_5d(dout, g).to(acc_t), _as_5d(out, g).to(acc_t)
    z, h_kv, _, n_q, _ = q5.shape
    n_k = k5.shape[-2]
    causal, bounded, left, right = band(causal, window, n_q, n_k)
    lse5 = _as_5d(lse.unsqueeze(-1), g).squeeze(-1).to(acc_t)
    delta = (g5 * o5).sum(-1)
    if dlse is not None:
        delta = delta - _as_5d(dlse.unsqueeze(-1), g).squeeze(-1).to(acc_t)
    lse5 = torch.where(lse5 == float("-inf"), float("inf"), lse5)  # rows that saw no key: p = 0
    q_len, kv_len = _limits(seq_lens, z, n_q, n_k, q.device)
    rows = torch.arange(n_q, device=q.device).view(1, 1, 1, n_q, 1)
    slopes = _per_head(alibi_slopes, h_kv, g, acc_t)

    dq5 = torch.zeros(q5.shape, dtype=acc_t, device=q.device)
    dk5 = torch.zeros(k5.shape, dtype=acc_t, device=q.device)
    dv5 = torch.zeros(v5.shape, dtype=acc_t, device=q.device)
    for n0 in range(0, n_k, block_n):
        kb, vb, cols, qk = _key_block(q5, k5, v5, n0, block_n, acc_t)
        s, t = _scores(qk, rows, cols, n_k - n_q, scale, softcap, slopes)
        p = torch.exp(s - lse5.unsqueeze(-1))
        p = torch.where(_visible(rows, cols, q_len, kv_len, causal, n_k - n_q, bounded, left, right), p, 0.0)
        # the group's query heads (dim 2) sum into their kv head, in a fixed order
        dv5[..., n0 : n0 + block_n, :] = torch.matmul(p.transpose(-1, -2), g5).sum(2, keepdim=True)
        ds = p * (torch.matmul(g5, vb.transpose(-1, -2)) - delta.unsqueeze(-1))
        if t is not None:
            ds = ds * (1 - t * t)
        dq5 += torch.matmul(ds, kb) * scale
        dk5[..., n0 : n0 + block_n, :] = (torch.matmul(ds.transpose(-1, -2), q5) * scale).sum(2, keepdim=True)
    for dst, src in ((dq, dq5), (dk, dk5), (dv, dv5)):
        dst.copy_(src.flatten(1, 2) if dst.dim() == 4 else src.flatten(1, 3))
    return dq, dk, dv


def sinks_grad(sinks, out, dout, lse, dlse):
    """d loss / d sinks[h] = -sum over batch and rows of p_sink * (rowsum(dout * out) - dlse), p_sink =
    exp(sink - lse) (d lse / d sink = p_sink, d out / d sink = -p_sink * out). Padding rows (lse = -inf)
    add nothing. fp32 (fp64 for fp64 inputs), shaped like sinks; the same on every device."""
    acc_t = _acc_dtype(out.dtype)
    delta = (dout.to(acc_t) * out.to(acc_t)).sum(-1)
    if dlse is not None:
        delta = delta - dlse.to(acc_t)
    lse = lse.to(acc_t)
    p_sink = torch.exp(sinks.to(acc_t).view(-1, 1) - torch.where(lse == float("-inf"), float("inf"), lse))
    return -(p_sink * delta).sum((0, 2)).to(sinks.dtype)
