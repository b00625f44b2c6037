"""Which keys a query sees, and which tiles a program computes: the masks and ranges every kernel
(forward, backward) applies, as small @triton.jit helpers. attention_torch.py mirrors them in PyTorch."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)


@triton.jit
def _valid_lengths(seq_lens_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS: tl.constexpr):
    """Rows < q_len and keys < kv_len take part; the rest is padding."""
    q_len = seq_len_q
    kv_len = seq_len_k
    if HAS_SEQ_LENS:
        valid = tl.load(seq_lens_ptr + off_z)
        valid = tl.maximum(valid, 0)
        q_len = tl.minimum(q_len, valid)
        kv_len = tl.minimum(kv_len, valid)
    return q_len, kv_len



@triton.jit
def _tile(head_group, DEAL: tl.constexpr, REVERSE: tl.constexpr):
    """This program's (tile, head, batch) on a (tiles, heads, batch) grid. CUDA starts programs in
    linear order, axis 0 fastest; they are dealt out in groups of `head_group` heads, and within a
    group rank r of every head comes before rank r + 1. A causal kernel's tiles differ in work by rank
    (the last query blocks see the most keys: REVERSE; the first key blocks are seen by the most
    queries), so the heavy tiles of a whole group start first and the grid ends on light ones, while
    the group's streamed rows stay in L2 together. head_group = 1: one head after the other.
    Not DEAL: the program ids as they are, head after head (tiles of equal work need no dealing, and
    computing dealt ids cost the non-causal D64 backward ~358 -> ~326 TFLOPS on the H200)."""
    if not DEAL:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_tiles = tl.num_programs(0)
    num_heads = tl.num_programs(1)
    num_bh = num_heads * tl.num_programs(2)
    lin = tl.program_id(0) + num_tiles * (tl.program_id(1) + num_heads * tl.program_id(2).to(tl.int64))
    per_group = num_tiles * head_group
    group = lin // per_group
    first = group * head_group
    size = tl.minimum(num_bh - first, head_group)
    r = lin - group * per_group
    rank = (r // size).to(tl.int32)
    bh = (first + r % size).to(tl.int32)
    if REVERSE:
        tile = num_tiles - 1 - rank
    else:
        tile = rank
    return tile, bh % num_heads, bh // num_heads


@triton.jit
def _key_range(start_m, q_len, kv_len, causal_offset,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_SEQ_LENS: tl.constexpr, EVEN_N: tl.constexpr):
    """Key blocks of query rows [start_m, start_m + BLOCK_M): [0, full_hi) is visible to every row
    (no masks), [full_hi, hi) needs the key-length and causal masks. A block of padding rows (only
    with seq_lens: the grid has no block past N_q) gets an empty range.
    The non-causal bounds are kv_len itself where they can be: LLVM widens a loop counter to 64 bits
    when the bound is clamped (max, floor), which costs the forward's loop ~4 integer instructions per
    key block (Triton 3.6, sm_90 SASS)."""
    if CAUSAL:
        hi = tl.maximum(tl.minimum(kv_len, start_m + BLOCK_M + causal_offset), 0)
        full_hi = tl.maximum(tl.minimum(kv_len, start_m + 1 + causal_offset), 0) // BLOCK_N * BLOCK_N
    else:  # kv_len >= 0
        hi = kv_len
        full_hi = kv_len if EVEN_N else kv_len // BLOCK_N * BLOCK_N
    if HAS_SEQ_LENS:
        hi = tl.where(start_m < q_len, hi, 0)
        full_hi = tl.where(start_m < q_len, full_hi, 0)
    return full_hi, hi
