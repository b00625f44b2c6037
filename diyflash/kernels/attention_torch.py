"""The attention algorithm of kernels/attention in plain PyTorch, blocked over keys.

Serves CPU tensors when Triton's interpreter is off (so models trace, export and run on CPU-only
machines) and float64 anywhere (gradcheck). Same semantics as the Triton kernels, function for function
with kernels/attention/semantics.py: `_scores` (scale, softcap, ALiBi), `_visible` (key length, causal,
window), contract.band (how a window's sides are normalised); bottom-right alignment, seq_lens, sinks, GQA,
D_v != D, lse = -inf and output 0 for rows that see no key (lse = the sink for a row with a sink).
Memory is O(N_q * BLOCK_N) per (batch, head): no N_q x N_k buffer for the whole sequence. GQA reads k
and v through broadcasting views: no copy, no repeat.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .contract import SINK_CAP, band, empty_out, kvcache_capacity

BLOCK_N = 128


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


class _Geometry(NamedTuple):
    """Where each query row and key column sits (semantics._sequence), broadcastable to the (Z, H_kv, G,
    rows, cols) score tiles: positions, their sequence's lengths and causal offset. Dense calls: rows
    0..N_q-1 of slice z, lengths N (or seq_lens), offset N_k - N_q. Packed sequences (seg_q, seg_k, pos_k
    set): one slice of all tokens; a row sees only keys of its own sequence, positions count from the
    sequence's start, and the offset is its own kv_len - q_len."""

    rows: torch.Tensor
    q_len: torch.Tensor
    kv_len: torch.Tensor
    offset: torch.Tensor | int
    seg_q: torch.Tensor | None = None
    seg_k: torch.Tensor | None = None
    pos_k: torch.Tensor | None = None
    kv_start: torch.Tensor | None = None  # a left-padded KV cache: the first key of each slice

    def cols(self, n0: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Keys [n0, n0 + n): their positions (1, 1, 1, 1, n), and for packed sequences whether each
        (row, key) pair is of one sequence."""
        if self.pos_k is None:
            return torch.arange(n0, n0 + n, device=device).view(1, 1, 1, 1, -1), None
        return self.pos_k[n0:n0 + n].view(1, 1, 1, 1, -1), self.seg_q == self.seg_k[n0:n0 + n].view(1, 1, 1, 1, -1)


def _dense_geometry(seq_lens, z: int, n_q: int, n_k: int, device) -> _Geometry:
    q_len, kv_len = _limits(seq_lens, z, n_q, n_k, device)
    return _Geometry(torch.arange(n_q, device=device).view(1, 1, 1, n_q, 1), q_len, kv_len, n_k - n_q)


def _segments(cu: torch.Tensor, total: int):
    """Per token of a packed tensor: its sequence (B for tokens past cu[-1]), its position in it, and the
    sequence's length. No host sync: searchsorted on the device."""
    cu = cu.to(torch.long)
    tokens = torch.arange(total, device=cu.device)
    seg = torch.searchsorted(cu[1:], tokens, right=True)
    seg_c = seg.clamp(max=cu.shape[0] - 2)
    return seg, tokens - cu[seg_c], (cu[1:] - cu[:-1])[seg_c]


def _packed_geometry(cu_q: torch.Tensor, cu_k: torch.Tensor, t_q: int, t_k: int) -> _Geometry:
    seg_q, pos_q, q_len = _segments(cu_q, t_q)
    seg_k, pos_k, _ = _segments(cu_k, t_k)
    batch = cu_q.shape[0] - 1
    seg_qc = seg_q.clamp(max=batch - 1)
    kv_len = (cu_k[1:] - cu_k[:-1]).to(torch.long)[seg_qc]
    q_len = torch.where(seg_q < batch, q_len, 0)  # tokens past cu_seqlens_q[-1]: no row
    view = (1, 1, 1, t_q, 1)
    return _Geometry(pos_q.view(view), q_len.view(view), kv_len.view(view), (kv_len - q_len).view(view),
                     seg_q.view(view), seg_k, pos_k)


def _visible(rows, cols, q_len, kv_len, causal: bool, causal_offset, bounded: bool, left: int, right: int,
             kv_start=None):
    """Bool, broadcast of (rows, cols): key col is visible to query row (semantics._visible; kv_start:
    semantics._from_start)."""
    vis = (cols < kv_len) & (rows < q_len)
    if kv_start is not None:
        vis = vis & (cols >= kv_start)
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


def _prescaled(q5: torch.Tensor, scale: float):
    """(q5 * p2, scale / p2) with p2 = 2^e <= 1 from scale's exponent (semantics._prescaled): both exact,
    so the scores round as before, but q.k overflows only where the scaled score does."""
    e = min(max(math.frexp(scale)[1] - 1, -64), 0)
    return q5 * 2.0**e, scale * 2.0**-e


def _per_head(t: torch.Tensor | None, h_kv: int, groups: int, acc_t) -> torch.Tensor | None:
    """ALiBi slopes (H,) or (Z, H) -> (Z or 1, Hkv, G, 1, 1) in the accumulation dtype."""
    if t is None:
        return None
    t = t.to(acc_t)
    return t.reshape(-1, h_kv, groups, 1, 1)


def _key_block(qs, k5, v5, n0: int, block_n: int, acc_t, geo: _Geometry, causal: bool, bounded: bool, left: int,
               right: int, scale: float, softcap: float, slopes):
    """Keys [n0, n0 + block_n): their k and v in the accumulation dtype, the block's scores (_scores of
    qs.k with qs, scale from _prescaled), the softcap's tanh, and which (row, key) pairs are visible."""
    kb = k5[..., n0 : n0 + block_n, :].to(acc_t)
    vb = v5[..., n0 : n0 + block_n, :].to(acc_t)
    cols, same = geo.cols(n0, kb.shape[-2], qs.device)
    s, t = _scores(torch.matmul(qs, kb.transpose(-1, -2)), geo.rows, cols, geo.offset, scale, softcap, slopes)
    vis = _visible(geo.rows, cols, geo.q_len, geo.kv_len, causal, geo.offset, bounded, left, right, geo.kv_start)
    return kb, vb, s, t, vis if same is None else vis & same


def _groups(q, k) -> int:
    return (q.shape[1] // k.shape[1]) if q.dim() == 4 else 1


def _packed_5d(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Packed (T, H, D) -> (1, H / groups, groups, T, D) view."""
    return _as_5d(t.transpose(0, 1).unsqueeze(0), groups)


def _packed_slopes(alibi_slopes, geo: _Geometry, h_kv: int, groups: int, acc_t):
    """ALiBi slopes of packed sequences: (H,) as usual; (B, H) row b for the tokens of sequence b."""
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return _per_head(alibi_slopes, h_kv, groups, acc_t)
    per_token = alibi_slopes.to(acc_t)[geo.seg_q.view(-1).clamp(max=alibi_slopes.shape[0] - 1)]  # (T, H)
    return per_token.transpose(0, 1).reshape(1, h_kv, groups, -1, 1)


def _restore(dst: torch.Tensor, src5: torch.Tensor, packed: bool) -> torch.Tensor:
    """Copy a (Z, H_kv, G, N, ...) result into dst: (Z, H, N, ...), (ZH, N, ...), or packed (T, H, ...)
    (lse of packed sequences: (H, T))."""
    flat = src5.flatten(1, 2)
    if packed:
        flat = flat[0] if dst.dim() == 2 else flat[0].transpose(0, 1)
    elif dst.dim() == flat.dim() - 1:
        flat = flat.flatten(0, 1)
    return dst.copy_(flat)


def attention_fwd_blocked(q, k, v, causal: bool, scale: float, seq_lens, block_n: int = BLOCK_N, *,
                          window=(-1, -1), offset: int = 0, softcap: float = 0.0, alibi_slopes=None, sinks=None,
                          packed=None, kv_lens=None, kv_starts=None):
    """packed: (cu_seqlens_k, max_seqlen_q, max_seqlen_k) for packed (T, H, D) inputs, seq_lens then being
    cu_seqlens_q; out (T_q, H, D_v), lse (H, T_q). kv_lens (Z,): batch z sees its first kv_lens[z] keys,
    bottom-right aligned to that length (a KV cache; seq_lens unused); kv_starts (Z,): and only to keys from
    kv_starts[z] on (a left-padded cache). offset: the diagonal offset (contract.band)."""
    acc_t = _acc_dtype(q.dtype)
    out = empty_out(q, v.shape[-1])
    if packed is not None:
        g = q.shape[1] // k.shape[1]
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=acc_t, device=q.device)
    else:
        g = _groups(q, k)
        lse = torch.empty(q.shape[:-1], dtype=acc_t, device=q.device)
    if out.numel() == 0:
        return out, lse
    if packed is not None:
        cu_k, max_q, max_k = packed
        q5, k5, v5 = _packed_5d(q, g).to(acc_t), _packed_5d(k, 1), _packed_5d(v, 1)
        geo = _packed_geometry(seq_lens, cu_k, q.shape[0], k.shape[0])
        n_q, n_k = max_q, max_k
    else:
        q5, k5, v5 = _as_5d(q, g).to(acc_t), _as_5d(k, 1), _as_5d(v, 1)
        n_q, n_k = q5.shape[-2], k5.shape[-2]
        geo = _dense_geometry(seq_lens, q5.shape[0], n_q, n_k, q.device)
        if kv_lens is not None:
            kv_len = kv_lens.to(torch.long).clamp(0, n_k).view(-1, 1, 1, 1, 1)
            geo = geo._replace(kv_len=kv_len, offset=kv_len - n_q)
        if kv_starts is not None:
            geo = geo._replace(kv_start=kv_starts.to(torch.long).view(-1, 1, 1, 1, 1))
    z, h_kv, _, rows_n, _ = q5.shape
    causal, bounded, left, right = band(causal, window, n_q, n_k, offset)
    if packed is not None:
        slopes = _packed_slopes(alibi_slopes, geo, h_kv, g, acc_t)
    else:
        slopes = _per_head(alibi_slopes, h_kv, g, acc_t)

    stats = (z, h_kv, g, rows_n)
    if sinks is None:
        m = torch.full(stats, float("-inf"), dtype=acc_t, device=q.device)
        l = torch.zeros(stats, dtype=acc_t, device=q.device)
    else:  # the sink starts every row: max = sink (capped as semantics._sink_start caps it), sum = 1
        m = sinks.to(acc_t).clamp(max=SINK_CAP).view(1, h_kv, g, 1).expand(stats).clone()
        l = torch.ones(stats, dtype=acc_t, device=q.device)
    acc = torch.zeros((*stats, v.shape[-1]), dtype=acc_t, device=q.device)
    qs, rest = _prescaled(q5, scale)
    for n0 in range(0, k5.shape[-2], block_n):
        kb, vb, s, _, vis = _key_block(qs, k5, v5, n0, block_n, acc_t, geo, causal, bounded, left, right, rest,
                                       softcap, slopes)
        s = s.masked_fill(~vis, float("-inf"))
        # -- online softmax update (a row with no visible key keeps m = -inf and gets p = 0) --
        m_new = torch.maximum(m, s.amax(-1))
        m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)
        p = torch.exp(s - m_sub.unsqueeze(-1))
        alpha = torch.exp(m - m_sub)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vb)
        m = m_new
    live = (l > 0) & (geo.rows.squeeze(-1) < geo.q_len.squeeze(-1))
    l_safe = torch.where(live, l, 1.0)
    out5 = torch.where(live.unsqueeze(-1), acc / l_safe.unsqueeze(-1), 0.0)
    lse5 = torch.where(live, m + torch.log(l_safe), float("-inf"))
    if sinks is not None:  # semantics._sink_lse: a sink past the cap holds all of its row's mass
        sink = sinks.to(acc_t).view(1, h_kv, g, 1)
        lse5 = torch.where(live & (sink >= SINK_CAP), torch.maximum(lse5, sink), lse5)
    _restore(out, out5, packed is not None)
    _restore(lse, lse5, packed is not None)
    return out, lse


def attention_bwd_blocked(dout, dlse, q, k, v, out, lse, causal: bool, scale: float, seq_lens,
                          block_n: int = BLOCK_N, *, window=(-1, -1), offset: int = 0, softcap: float = 0.0,
                          alibi_slopes=None, packed=None):
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    acc_t = _acc_dtype(q.dtype)
    if packed is not None:
        cu_k, n_q, n_k = packed
        g = q.shape[1] // k.shape[1]
        five = _packed_5d
        geo = _packed_geometry(seq_lens, cu_k, q.shape[0], k.shape[0])
        stats5 = lambda t: _as_5d(t.unsqueeze(0).unsqueeze(-1), g).squeeze(-1)  # noqa: E731  (H, T) rows
    else:
        g = _groups(q, k)
        five = _as_5d
        n_q, n_k = q.shape[-2], k.shape[-2]
        geo = _dense_geometry(seq_lens, _as_5d(q, g).shape[0], n_q, n_k, q.device)
        stats5 = lambda t: _as_5d(t.unsqueeze(-1), g).squeeze(-1)  # noqa: E731
    q5, k5, v5 = five(q, g).to(acc_t), five(k, 1), five(v, 1)
    g5, o5 = five(dout, g).to(acc_t), five(out, g).to(acc_t)
    h_kv = q5.shape[1]
    causal, bounded, left, right = band(causal, window, n_q, n_k, offset)
    lse5 = stats5(lse).to(acc_t)
    delta = (g5 * o5).sum(-1)
    if dlse is not None:
        delta = delta - stats5(dlse).to(acc_t)
    lse5 = torch.where(lse5 == float("-inf"), float("inf"), lse5)  # rows that saw no key: p = 0
    if packed is not None:
        slopes = _packed_slopes(alibi_slopes, geo, h_kv, g, acc_t)
    else:
        slopes = _per_head(alibi_slopes, h_kv, g, acc_t)

    dq5 = torch.zeros(q5.shape, dtype=acc_t, device=q.device)
    dk5 = torch.zeros(k5.shape, dtype=acc_t, device=q.device)
    dv5 = torch.zeros(v5.shape, dtype=acc_t, device=q.device)
    qs, rest = _prescaled(q5, scale)
    for n0 in range(0, k5.shape[-2], block_n):
        kb, vb, s, t, vis = _key_block(qs, k5, v5, n0, block_n, acc_t, geo, causal, bounded, left, right, rest,
                                       softcap, slopes)
        p = torch.where(vis, torch.exp((s - lse5.unsqueeze(-1)).clamp(max=0.0)), 0.0)  # <= 1 (backward._probs)
        # the group's query heads (dim 2) sum into their kv head, in a fixed order
        dv5[..., n0 : n0 + block_n, :] = torch.matmul(p.transpose(-1, -2), g5).sum(2, keepdim=True)
        ds = p * (torch.matmul(g5, vb.transpose(-1, -2)) - delta.unsqueeze(-1))
        if t is not None:
            ds = ds * (1 - t * t)
        dq5 += torch.matmul(ds, kb) * scale
        dk5[..., n0 : n0 + block_n, :] = (torch.matmul(ds.transpose(-1, -2), q5) * scale).sum(2, keepdim=True)
    for dst, src in ((dq, dq5), (dk, dk5), (dv, dv5)):
        _restore(dst, src, packed is not None)
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
    diff = sinks.to(acc_t).view(-1, 1) - torch.where(lse == float("-inf"), float("inf"), lse)
    # a +inf sink has lse +inf: inf - inf is its probability 1 (it holds all of its row's mass)
    p_sink = torch.exp(torch.where(diff.isnan(), 0.0, diff).clamp(max=0.0))
    return -(p_sink * delta).sum((0, 2)).to(sinks.dtype)


def _cache_rows(cache_seqlens, n: int, capacity: int, block_table, page_size: int, num_pages: int, start=None):
    """Batch and in-cache (page, row) indices of cache positions start[b] + j, j < n (start = 0 when None),
    with whether each is inside the cache (decode._cache_slots: out-of-range positions and page entries)."""
    b = cache_seqlens.shape[0]
    pos = torch.arange(n, device=cache_seqlens.device).view(1, n).expand(b, n).to(torch.long)
    if start is not None:
        pos = pos + start.to(torch.long).view(b, 1)
    ok = (pos >= 0) & (pos < capacity)
    batch = torch.arange(b, device=pos.device).view(b, 1).expand(b, n)
    if block_table is None:
        return batch, pos.clamp(0, max(capacity - 1, 0)), ok
    page = block_table.to(torch.long).gather(1, (pos // page_size).clamp(0, block_table.shape[1] - 1))
    ok = ok & (page >= 0) & (page < num_pages)
    return page.clamp(0, num_pages - 1), pos % page_size, ok


def attention_kvcache_torch(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal: bool, scale: float,
                            *, window=(-1, -1), softcap: float = 0.0, alibi_slopes=None, sinks=None,
                            cache_leftpad=None):
    """KV-cache attention (kernels/attention/kvcache.py) in PyTorch: the new keys written in place at
    cache_seqlens[b] + j, then each batch's first cache_seqlens[b] + N_new keys (from cache_leftpad[b] on,
    if given) gathered (pages through the block table) and attended to, bottom-right aligned."""
    paged = block_table is not None
    page_size = k_cache.shape[2] if paged else 1
    capacity = kvcache_capacity(k_cache, block_table)
    num_pages = k_cache.shape[0]
    n_new = 0 if k_new is None else k_new.shape[2]
    if n_new:
        first, row, ok = _cache_rows(cache_seqlens, n_new, capacity, block_table, page_size, num_pages,
                                     start=cache_seqlens)
        for cache, new in ((k_cache, k_new), (v_cache, v_new)):
            rows = cache.transpose(1, 2)  # (batch or page, row, H_kv, D): a view, written in place
            rows[first[ok], row[ok]] = new.transpose(1, 2)[ok].to(cache.dtype)
    first, row, ok = _cache_rows(cache_seqlens, capacity, capacity, block_table, page_size, num_pages)
    keys = k_cache.transpose(1, 2)[first, row].transpose(1, 2)  # (B, H_kv, capacity, D), a gathered copy
    values = v_cache.transpose(1, 2)[first, row].transpose(1, 2)
    kv_lens = (cache_seqlens.to(torch.long) + n_new).clamp(0, capacity)
    return attention_fwd_blocked(q, keys, values, causal, scale, None, window=window, softcap=softcap,
                                 alibi_slopes=alibi_slopes, sinks=sinks, kv_lens=kv_lens, kv_starts=cache_leftpad)
