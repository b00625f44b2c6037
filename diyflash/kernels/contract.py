"""The attention contract, once for every implementation: how a call's variant is normalised (band,
Variant), how many keys a query row sees (mean_keys), how its output is allocated (empty_out), the
constants of the kernels' units and of the sink cap, and when a call takes the decode kernel
(DECODE_MAX_ROWS). torch only (no triton, no numpy): the PyTorch path (attention_torch.py), the Triton
launchers (kernels/attention/) and the ops' fakes import it, not one another."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

# Base-2 units: the kernels keep scores as s2 = log2(e) * s (exp2 is the hardware's exponential) and hand
# lse back in natural units (* ln 2). semantics.py takes its tl.constexpr copies from here.
LOG2E = 1 / math.log(2)  # exp(x) == exp2(x * LOG2E)
LN2 = math.log(2)

# A sink past SINK_CAP2 in base 2 (+inf included) starts its rows there: every key's p is then 0, the output
# 0, and the row's lse the sink itself (semantics._sink_start, _sink_lse). SINK_CAP: the same in natural
# units (~5.9e37), for the PyTorch path and the reference.
SINK_CAP2 = 2.0**126
SINK_CAP = SINK_CAP2 * LN2

DECODE_MAX_ROWS = 64  # the decode kernel's largest row tile (kvcache.decode_rows), also decode_route's bound


def kvcache_capacity(k_cache, block_table) -> int:
    """The keys a KV cache holds per batch row: N_cache, or max_pages * page_size for a paged one
    (k_cache (num_pages, H_kv, page_size, D) read through block_table (B, max_pages))."""
    return block_table.shape[1] * k_cache.shape[2] if block_table is not None else k_cache.shape[2]


def few_query_rows(q_shape, k_shape) -> bool:
    """The decode route's shape rule (launch.decode_route): 4-D q and k whose N_q query rows times the GQA
    group fit one decode tile."""
    return (len(q_shape) == 4 and len(k_shape) == 4 and k_shape[1] > 0
            and q_shape[2] * (q_shape[1] // k_shape[1]) <= DECODE_MAX_ROWS)


def band(causal: bool, window: tuple[int, int], n_q: int, n_k: int,
         offset: int = 0) -> tuple[bool, bool, int, int]:
    """(causal, bounded, left, right) as every implementation applies them: a non-causal window whose
    right side is 0 is causal; causal caps right at 0; an unbounded side (-1) becomes N_q + N_k (+ |offset|),
    which no distance reaches; `bounded` says whether any side still bounds.
    offset (diagonal_offset): query row i sits at key position i + N_k - N_q + offset. A nonzero offset is
    folded into the band, so no kernel takes it: key j is visible iff i + N_k - N_q - left' <= j <=
    i + N_k - N_q + right' with left' = left - offset and right' = right + offset (right = 0 under causal),
    a non-causal bounded window whose sides may be negative. ALiBi's distance does not move with it (the
    ops refuse ALiBi with an offset)."""
    left, right = window
    if right == 0 and not causal:
        causal = True
    unbounded = n_q + n_k + abs(offset)
    bounded = left >= 0 or (right >= 0 and not causal)
    left = unbounded if left < 0 else min(left, unbounded)
    right = 0 if causal else unbounded if right < 0 else min(right, unbounded)
    if offset:
        return False, True, left - offset, right + offset
    return causal, bounded, left, right


class Variant(NamedTuple):
    """A call's variant arguments as the kernels take them (semantics.py): `causal` after folding a
    non-causal window with right edge 0 into it; `window` a bounded band (the unbounded side passed as
    N_q + N_k, right capped at 0 under causal); cap2 = softcap * log2(e); GQA's query heads per kv head."""

    causal: bool
    window: bool
    left: int
    right: int
    cap2: float
    kv_group: int

    @property
    def softcap(self) -> bool:
        return self.cap2 > 0


def variant(causal: bool, window: tuple[int, int], softcap: float, n_q: int, n_k: int, h: int, h_kv: int,
            offset: int = 0) -> Variant:
    causal, bounded, left, right = band(causal, window, n_q, n_k, offset)
    return Variant(causal, bounded, left, right, softcap * LOG2E, h // h_kv)


def mean_keys(var: Variant, n_q: int, n_k: int) -> float:
    """How many keys a query row sees on average under var's band (query row i at key position
    i + N_k - N_q, keys [position - left, position + right] within [0, N_k)): N_k without a band, about
    N_k / 2 causal at N_q = N_k. Where the Hopper forward's tiles pay off (hopper.AUTO_MIN_KEYS)."""
    if n_q == 0 or n_k == 0:
        return 0.0
    pos = torch.arange(n_k - n_q, n_k, dtype=torch.int64, device="cpu")  # never the default device: no sync
    seen = (pos + var.right).clamp(max=n_k - 1) - (pos - var.left).clamp(min=0) + 1  # right: 0 under causal (band)
    return seen.clamp(min=0).sum().item() / n_q


def empty_out(q: torch.Tensor, dv: int) -> torch.Tensor:
    """The output (..., N_q, D_v) in q's memory layout: torch.empty_like(q) when D_v = D, else the
    same dimension order; contiguous where q is not dense (expanded or sliced), as empty_like makes it.
    Every path and the ops' fakes allocate it here, so their strides agree."""
    if q.shape[-1] == dv:
        return torch.empty_like(q)
    if not _dense(q):
        # ordering an expanded q's dims by stride put its batch (stride 0) innermost: an output with batch
        # stride 1 and head_dim stride B, which the H200 forward faulted on (tests/test_differential.py)
        return torch.empty((*q.shape[:-1], dv), dtype=q.dtype, device=q.device)
    order = sorted(range(q.dim()), key=lambda i: -q.stride(i))  # q's dims, outermost first
    shape = (*q.shape[:-1], dv)
    dense = torch.empty([shape[i] for i in order], dtype=q.dtype, device=q.device)
    return dense.permute([order.index(i) for i in range(q.dim())])


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its memory exactly once in some order of its dims (non-overlapping and
    dense, as PyTorch's empty_like asks before it keeps a layout)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True
