"""FlashAttention-2 forward and backward in Triton, and their launchers.

Ladder: `_attn_fwd_kernel` (jit) -> `attention_fwd` (launcher) -> `diyflash::attention_fwd` (op, in
diyflash/ops) -> `diyflash.flash_attention` (public). This module knows nothing of torch.library.

Layout: every tensor is addressed through four strides (batch z, head h, row, dim), so any
permutation or slice of storage is read in place. A 3-D (BH, N, D) input is viewed as (BH, 1, N, D).

Semantics shared by all kernels (and by the PyTorch path in attention_torch.py):
- scores are s = (q . k) * scale; the kernels work in base 2: qk_scale = scale * log2(e).
- causal: query i sees key j iff j <= i + (seq_len_k - seq_len_q) (bottom-right alignment).
- seq_lens[z] = L (optional): keys j >= L are ignored and query rows i >= L output 0 (lse = -inf).
  L is clamped to [0, N] inside the kernels, so a bad value can never read out of bounds.
- a row that sees no key outputs 0 and has lse = -inf; no NaN from finite inputs.
- lse is the natural-log log-sum-exp of the scaled scores, fp32, shape (Z, H, N_q).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._runtime import device_limits, require_triton
from .attention_configs import MAX_BLOCK_ROWS, AttnConfig, BwdConfig, bwd_config, fwd_config, head_dim_pad

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)

from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from ._launch import BoundLaunch, DirectLauncher, cdiv, ensure_scratch_allocator, runtime_key  # noqa: E402

LOG2E = 1.4426950408889634  # 1 / ln(2): exp(x) == exp2(x * LOG2E)
MAX_GRID_Z = 65535  # CUDA's limit on gridDim.y and gridDim.z


# ----------------------------------------------------------------------------------------------------
# Helpers shared by the kernels
# ----------------------------------------------------------------------------------------------------
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
def _load(ptrs, mask, UPCAST: tl.constexpr):
    # UPCAST: only under Triton's interpreter, whose bf16 tl.dot is wrong (triton-lang/triton#11584);
    # bf16 tiles are widened to fp32 right after the load there. Compiled kernels never take it.
    if mask is None:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _rows_desc(base, rows, row_stride, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """A TMA descriptor over one (z, h) slice: `rows` rows of HEAD_DIM contiguous elements, read in
    (BLOCK, HEAD_DIM_PAD) tiles. The hardware fills rows >= `rows` and columns >= HEAD_DIM with zeros,
    so a slice's valid length (seq_lens) is its shape and tail tiles need no load masks. At least one
    row: a descriptor of an empty slice is never read, but must still be valid."""
    return tl.make_tensor_descriptor(base, shape=[tl.maximum(rows, 1), HEAD_DIM], strides=[row_stride, 1],
                                     block_shape=[BLOCK, HEAD_DIM_PAD])


@triton.jit
def _streamed(base, rows, row_stride, d_stride, offs_r, offs_d,
              HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              TRANSPOSED: tl.constexpr, TMA: tl.constexpr):
    """Where a loop's streamed (BLOCK, HEAD_DIM) tiles come from: a TMA descriptor, or the pointer tile
    of the first block ((D, BLOCK) when TRANSPOSED), which the loop advances."""
    if TMA:
        src = _rows_desc(base, rows, row_stride, HEAD_DIM, BLOCK, HEAD_DIM_PAD)
    elif TRANSPOSED:
        src = base + offs_r[None, :] * row_stride + offs_d[:, None] * d_stride
    else:
        src = base + offs_r[:, None] * row_stride + offs_d[None, :] * d_stride
    return src


@triton.jit
def _desc_load(desc, row, UPCAST: tl.constexpr):
    x = desc.load([row, 0])
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _desc_load4(desc, z, h, row, UPCAST: tl.constexpr):
    """The (BLOCK, HEAD_DIM_PAD) tile at `row` of slice (z, h) from a host-built descriptor over the whole
    (Z, H, N, D) tensor (host_descriptor), whose blocks are (1, 1, BLOCK, HEAD_DIM_PAD). Rows >= N and
    columns >= D read as zeros, per slice: a tail tile never reaches into the next head."""
    x = desc.load([z, h, row, 0])
    x = x.reshape(x.shape[2], x.shape[3])
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _stepped(a_ptrs, b_ptrs, start, step_a, step_b, ROWOFF: tl.constexpr, ROW32: tl.constexpr):
    """The pointer tiles of the streamed block at row `start`. ROWOFF: a_ptrs and b_ptrs are the first
    block's tiles, offset here by the row offset start * step (AttnConfig.rowoff), in 64 bits unless
    ROW32; else the loop advances them and they are already there."""
    if ROWOFF:
        if ROW32:
            return a_ptrs + start * step_a, b_ptrs + start * step_b
        return a_ptrs + tl.cast(start, tl.int64) * step_a, b_ptrs + tl.cast(start, tl.int64) * step_b
    return a_ptrs, b_ptrs


@triton.jit
def _rows(offs, ROW32: tl.constexpr):
    """Row indices to multiply by a row stride: as they are when ROW32 (the launcher checked that every
    offset inside a (batch, head) slice fits in int32: rows_fit_int32), else widened to 64 bits."""
    if ROW32:
        rows = offs
    else:
        rows = offs.to(tl.int64)
    return rows


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


# ----------------------------------------------------------------------------------------------------
# Lazy rescaling (forward): a row's running max m moves only when a block's max passes it by more than
# LAZY_SLACK (base 2), so p = exp2(s - m) <= 2^LAZY_SLACK, and a warp whose rows all kept theirs skips
# the rescale of its accumulator (one multiply per accumulator element per key block) by a branch.
# ----------------------------------------------------------------------------------------------------
LAZY_SLACK: tl.constexpr = tl.constexpr(8.0)


def _vote_asm(n: int) -> str:
    """PTX for one thread's n row flags ($n..$2n-1, int32): every output ($0..$n-1) is 1 when any row
    flag of any thread of the warp is set, else 0 (vote.sync.any: the same value in every lane)."""
    ors = "".join(f"or.b32 %t, %t, ${n + i};\n" for i in range(1, n))
    outs = "".join(f"mov.b32 ${i}, $0;\n" for i in range(1, n))
    return ("{\n.reg .pred %p;\n.reg .b32 %t;\n"
            f"mov.b32 %t, ${n};\n{ors}"
            "setp.ne.b32 %p, %t, 0;\nvote.sync.any.pred %p, %p, 0xffffffff;\n"
            f"selp.b32 $0, 1, 0, %p;\n{outs}}}")


def _rescale_asm(n: int) -> str:
    """PTX for n accumulator elements ($0..$n-1, tied to their inputs) times their row's alpha
    ($2n..$3n-1), skipped by a branch when the warp's flag ($3n, warp-uniform) is 0. A label inside a
    { } block is local to it, so the block can be inlined any number of times into one kernel."""
    muls = "".join(f"mul.f32 ${i}, ${i}, ${2 * n + i};\n" for i in range(n))
    return ("{\n.reg .pred %p;\n"
            f"setp.eq.b32 %p, ${3 * n}, 0;\n@%p bra SKIP;\n{muls}SKIP:\n}}")


VOTE_PACKS = (1, 2, 4)
_RESCALE_N = 32  # accumulator elements per inline-asm block (a divisor of every lazy tile's per-thread count)
RESCALE_PACK: tl.constexpr = tl.constexpr(_RESCALE_N)
_VOTE_1: tl.constexpr = tl.constexpr(_vote_asm(1))
_VOTE_2: tl.constexpr = tl.constexpr(_vote_asm(2))
_VOTE_4: tl.constexpr = tl.constexpr(_vote_asm(4))
_RESCALE: tl.constexpr = tl.constexpr(_rescale_asm(_RESCALE_N))
_RESCALE_CONSTRAINTS: tl.constexpr = tl.constexpr(
    ",".join(["=f"] * _RESCALE_N + [str(i) for i in range(_RESCALE_N)] + ["f"] * _RESCALE_N + ["r"] * _RESCALE_N))


@triton.jit
def _warp_any(flag, ROWS: tl.constexpr):
    """flag: (BLOCK_M,) int32 of the rows' flags, in the accumulator's row layout, which gives each
    thread ROWS rows. Returns, for every row, whether any row of its warp has its flag set. ROWS must be
    every row a thread holds (vote_rows): pack=ROWS hands them all to one asm block, which ORs them before
    the vote; with fewer, each block would vote on part of them and a warp could skip a rescale one of its
    rows needs (test_lazy_rescaling_skips_only_warps_that_kept_every_max would see it, bit for bit)."""
    if ROWS == 1:
        out = tl.inline_asm_elementwise(_VOTE_1, "=r,r", [flag], dtype=tl.int32, is_pure=True, pack=1)
    elif ROWS == 2:
        out = tl.inline_asm_elementwise(_VOTE_2, "=r,=r,r,r", [flag], dtype=tl.int32, is_pure=True, pack=2)
    else:
        tl.static_assert(ROWS == 4)
        out = tl.inline_asm_elementwise(_VOTE_4, "=r,=r,=r,=r,r,r,r,r", [flag], dtype=tl.int32, is_pure=True,
                                        pack=4)
    return out


@triton.jit
def _rescale(acc, alpha, grew, VOTE_ROWS: tl.constexpr):
    """acc * alpha[:, None]. VOTE_ROWS (compiled kernels with lazy rescaling: the rows each thread holds,
    see _warp_any; 0 = a plain multiply): alpha is exactly 1 on every row that did not grow (`grew`), and
    a warp none of whose rows grew skips the multiply by a branch, which gives the same bits."""
    if VOTE_ROWS:
        warp_grew = _warp_any(grew.to(tl.int32), VOTE_ROWS)
        acc = tl.inline_asm_elementwise(_RESCALE, _RESCALE_CONSTRAINTS,
                                        [acc, alpha[:, None], warp_grew[:, None]],
                                        dtype=tl.float32, is_pure=True, pack=RESCALE_PACK)
    else:
        acc = acc * alpha[:, None]
    return acc


# ----------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    k_ptrs, v_ptrs, step_k, step_v,
    offs_m, offs_n, d_mask,
    lo, hi, kv_len, causal_offset, qk_scale, off_z, off_h,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, EVEN_N: tl.constexpr,
    FOLD_SCALE: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
    WS: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr, HOST_DESC: tl.constexpr, LAZY: tl.constexpr,
    VOTE_ROWS: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi). MASKED blocks apply the causal mask, and the key-length
    mask unless EVEN_N (every key block full, so every key below hi <= kv_len is in range); unmasked
    blocks are fully in range and fully visible to every row of this query block.
    TMA: k_ptrs and v_ptrs are tensor descriptors (_rows_desc) instead of pointer tiles; HOST_DESC: built
    on the host over the whole tensors, read at slice (off_z, off_h) (_desc_load4).
    WS: Triton's automatic warp specialization of the loop (loads, dots and softmax in separate warps).
    ROWOFF: each pointer tile is the first tile plus a row offset (_stepped), instead of pointer tiles
    advanced block by block (AttnConfig.rowoff: the same loads, which ptxas schedules differently)."""
    KEY_MASK: tl.constexpr = MASKED and not EVEN_N
    if not TMA and not ROWOFF:
        k_ptrs += tl.cast(lo, tl.int64) * step_k
        v_ptrs += tl.cast(lo, tl.int64) * step_v
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        if KEY_MASK:
            kv_mask = cols < kv_len
        k_at, v_at = _stepped(k_ptrs, v_ptrs, start_n, step_k, step_v, ROWOFF, ROW32)
        if HOST_DESC:
            k = _desc_load4(k_ptrs, off_z, off_h, start_n, UPCAST).T  # (D, BLOCK_N)
        elif TMA:
            k = _desc_load(k_ptrs, start_n, UPCAST).T
        elif KEY_MASK:
            k = _load(k_at, kv_mask[None, :] & d_mask[:, None], UPCAST)  # (D, BLOCK_N)
        elif EVEN_D:
            k = _load(k_at, None, UPCAST)
        else:
            k = _load(k_at, d_mask[:, None], UPCAST)
        # -- scores, base 2. FOLD_SCALE (qk_scale > 0): the row max of the raw dot scales to the max
        # of the scaled scores, so the scale rides in the exponent's FMA: one op per score saved --
        s = tl.dot(q, k, input_precision=DOT_PRECISION)
        if not FOLD_SCALE:
            s = s * qk_scale
        if MASKED:
            if CAUSAL:
                visible = cols[None, :] <= offs_m[:, None] + causal_offset
                if KEY_MASK:
                    visible = visible & kv_mask[None, :]
            else:
                visible = kv_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
        # -- online softmax update --
        if FOLD_SCALE:
            m_blk = tl.max(s, 1) * qk_scale
        else:
            m_blk = tl.max(s, 1)
        if LAZY:
            grew = m_blk > m_i + LAZY_SLACK
            m_new = tl.where(grew, m_blk, m_i)
        else:
            grew = None  # every row rescales: _rescale multiplies
            m_new = tl.maximum(m_i, m_blk)
        if MASKED:
            # a row with no visible key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_sub = m_new
        if FOLD_SCALE:
            p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        else:
            p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        if LAZY:
            alpha = tl.where(grew, alpha, 1.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        # -- accumulate p @ v --
        if HOST_DESC:
            v = _desc_load4(v_ptrs, off_z, off_h, start_n, UPCAST)
        elif TMA:
            v = _desc_load(v_ptrs, start_n, UPCAST)
        elif KEY_MASK:
            v = _load(v_at, kv_mask[:, None] & d_mask[None, :], UPCAST)
        elif EVEN_D:
            v = _load(v_at, None, UPCAST)
        else:
            v = _load(v_at, d_mask[None, :], UPCAST)
        acc = _rescale(acc, alpha, grew, VOTE_ROWS)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        if not TMA and not ROWOFF:
            k_ptrs += BLOCK_N * step_k
            v_ptrs += BLOCK_N * step_v
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["head_group"])  # a launch shape: no kernel variant per value
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, seq_lens_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_oz, stride_oh, stride_om, stride_od,
    stride_lz, stride_lh,
    num_heads, seq_len_q, seq_len_k,
    qk_scale, head_group,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, FOLD_SCALE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr,
    HOST_DESC: tl.constexpr, LAZY: tl.constexpr, VOTE_ROWS: tl.constexpr,
):
    """TMA: q, k and v are read through tensor descriptors (Hopper's copy engine) instead of pointer
    tiles; the launcher sets it only for inputs a descriptor can address (tma_ok). HOST_DESC (with TMA,
    without seq_lens): q_ptr, k_ptr and v_ptr are descriptors the launcher built over the whole tensors
    (host_descriptor) instead of pointers each program builds its slice's descriptors from. WS: the
    unmasked key loop is warp-specialized (the launcher sets it only with TMA). ROWOFF: see _attn_fwd_inner.
    ROW32: row offsets inside a (batch, head) slice are computed in 32 bits (rows_fit_int32).
    EVEN_M / EVEN_N: every query / key block is full (no seq_lens, the length a multiple of the block):
    rows need no masks, and a non-causal kernel with full key blocks has no masked key loop."""
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    pid_m, off_h, off_z = _tile(head_group, CAUSAL, CAUSAL)
    q_len, kv_len = _valid_lengths(seq_lens_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS)
    causal_offset = seq_len_k - seq_len_q

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM

    if HOST_DESC:
        q = _desc_load4(q_ptr, off_z, off_h, start_m, UPCAST)
        k_ptrs = k_ptr
        v_ptrs = v_ptr
    else:
        # 64-bit base offsets: z * stride_z alone can pass 2^31 elements
        q_base = q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
        k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
        v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
        if TMA:
            q = _desc_load(_rows_desc(q_base, q_len, stride_qm, HEAD_DIM, BLOCK_M, HEAD_DIM_PAD), start_m, UPCAST)
        else:
            q_ptrs = q_base + _rows(offs_m, ROW32)[:, None] * stride_qm + offs_d[None, :] * stride_qd
            if EVEN_M:
                q = _load(q_ptrs, None if EVEN_D else d_mask[None, :], UPCAST)
            else:
                q = _load(q_ptrs, (offs_m < q_len)[:, None] & d_mask[None, :], UPCAST)
        # k is read as k^T tiles (D, BLOCK_N) by pointers; a descriptor's (BLOCK_N, D) tile is transposed in the loop
        k_ptrs = _streamed(k_base, kv_len, stride_kn, stride_kd, offs_n, offs_d, HEAD_DIM, BLOCK_N, HEAD_DIM_PAD, True, TMA)
        v_ptrs = _streamed(v_base, kv_len, stride_vn, stride_vd, offs_n, offs_d, HEAD_DIM, BLOCK_N, HEAD_DIM_PAD, False, TMA)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    full_hi, hi = _key_range(start_m, q_len, kv_len, causal_offset, BLOCK_M, BLOCK_N, CAUSAL, HAS_SEQ_LENS, EVEN_N)

    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
        offs_m, offs_n, d_mask, 0, full_hi, kv_len, causal_offset, qk_scale, off_z, off_h,
        BLOCK_N, False, CAUSAL, EVEN_D, EVEN_N, FOLD_SCALE, DOT_PRECISION, UPCAST, TMA, WS, ROWOFF, ROW32, HOST_DESC,
        LAZY, VOTE_ROWS,
    )
    if CAUSAL or not EVEN_N:  # else full_hi = hi = N_k: no masked key block
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
            offs_m, offs_n, d_mask, full_hi, hi, kv_len, causal_offset, qk_scale, off_z, off_h,
            BLOCK_N, True, CAUSAL, EVEN_D, EVEN_N, FOLD_SCALE, DOT_PRECISION, UPCAST, TMA, False, ROWOFF, ROW32,
            HOST_DESC, False, 0,
        )

    # -- epilogue: normalise; rows that saw no key (l == 0) or are padding give 0 and lse = -inf. A row
    # that saw no key has acc == 0 exactly (each of its p was 0), so only seq_lens' padding rows, which
    # a block computes with its valid rows, need their output zeroed --
    if HAS_SEQ_LENS:
        row_live = (l_i > 0) & (offs_m < q_len)
    else:
        row_live = l_i > 0
    l_safe = tl.where(row_live, l_i, 1.0)
    if HAS_SEQ_LENS:
        out = tl.where(row_live[:, None], acc / l_safe[:, None], 0.0)
    else:
        out = acc / l_safe[:, None]
    lse = tl.where(row_live, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))  # * ln(2)

    o_ptrs = (out_ptr + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
              + _rows(offs_m, ROW32)[:, None] * stride_om + offs_d[None, :] * stride_od)
    l_ptrs = lse_ptr + off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + offs_m
    if EVEN_M:
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=None if EVEN_D else d_mask[None, :])
        tl.store(l_ptrs, lse)
    else:
        row_in = offs_m < seq_len_q
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & d_mask[None, :])
        tl.store(l_ptrs, lse, mask=row_in)


# ----------------------------------------------------------------------------------------------------
# Backward: delta = rowsum(dout * out) - dlse, then a dk/dv kernel (one program per key block) and a
# dq kernel (one program per query block). Each output element is written by exactly one program in a
# fixed loop order: no atomics, so gradients are bitwise deterministic.
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _attn_bwd_preprocess_kernel(
    out_ptr, dout_ptr, lse_ptr, dlse_ptr, delta_ptr, lse2_ptr,
    stride_oz, stride_oh, stride_om, stride_od,
    stride_gz, stride_gh, stride_gm, stride_gd,
    stride_lz, stride_lh, stride_lm,
    stride_dlz, stride_dlh, stride_dlm,
    num_heads, seq_len_q,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_DLSE: tl.constexpr,
):
    off_h = tl.program_id(1)
    off_z = tl.program_id(2)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_in = offs_m < seq_len_q
    mask = row_in[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(out_ptr + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
                + offs_m.to(tl.int64)[:, None] * stride_om + offs_d[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(dout_ptr + off_z.to(tl.int64) * stride_gz + off_h.to(tl.int64) * stride_gh
                 + offs_m.to(tl.int64)[:, None] * stride_gm + offs_d[None, :] * stride_gd, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    # lse and dlse may have any strides: torch.ops.diyflash.attention_bwd takes them from its caller
    if HAS_DLSE:
        # d lse_i / d s_ij = p_ij, so a gradient on lse joins delta with the opposite sign
        dlse = tl.load(dlse_ptr + off_z.to(tl.int64) * stride_dlz + off_h.to(tl.int64) * stride_dlh
                       + offs_m.to(tl.int64) * stride_dlm, mask=row_in, other=0.0)
        delta -= dlse.to(tl.float32)
    # the backward needs lse in base 2; a row that saw no key (lse = -inf) gets +inf so that
    # p = exp2(s - lse2) = 0 for it everywhere, masked block or not
    lse = tl.load(lse_ptr + off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh
                  + offs_m.to(tl.int64) * stride_lm, mask=row_in, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)  # * log2(e)
    row_off = (off_z * num_heads + off_h).to(tl.int64) * seq_len_q + offs_m
    tl.store(delta_ptr + row_off, delta, mask=row_in)
    tl.store(lse2_ptr + row_off, lse2, mask=row_in)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v,
    q_ptrs, do_ptrs, lse2_ptrs, delta_ptrs, step_q, step_do,
    offs_m, offs_n, d_mask,
    lo, hi, q_len, kv_len, causal_offset, qk_scale,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, DO_DK: tl.constexpr, DO_DV: tl.constexpr,
    TMA: tl.constexpr, WS: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr,
):
    """Accumulate dk, dv of one key block over the query blocks [lo, hi). Works transposed
    (keys x queries) so that p^T and ds^T come straight out of the dots. DO_DK / DO_DV: which of the
    two this pass accumulates (a split pass skips the other's dots and loads). TMA: q_ptrs and
    do_ptrs are tensor descriptors. ROWOFF: as in _attn_fwd_inner."""
    if not TMA and not ROWOFF:
        q_ptrs += tl.cast(lo, tl.int64) * step_q
        do_ptrs += tl.cast(lo, tl.int64) * step_do
    lse2_ptrs += lo
    delta_ptrs += lo
    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WS):
        rows = start_m + offs_m
        if MASKED:
            row_mask = rows < q_len
        q_at, do_at = _stepped(q_ptrs, do_ptrs, start_m, step_q, step_do, ROWOFF, ROW32)
        if TMA:
            q = _desc_load(q_ptrs, start_m, UPCAST)
            do = _desc_load(do_ptrs, start_m, UPCAST)
        elif MASKED:
            q = _load(q_at, row_mask[:, None] & d_mask[None, :], UPCAST)
            do = _load(do_at, row_mask[:, None] & d_mask[None, :], UPCAST)
        else:
            q = _load(q_at, None if EVEN_D else d_mask[None, :], UPCAST)
            do = _load(do_at, None if EVEN_D else d_mask[None, :], UPCAST)
        if MASKED:
            lse2 = tl.load(lse2_ptrs, mask=row_mask, other=float("inf"))
            if DO_DK:
                delta = tl.load(delta_ptrs, mask=row_mask, other=0.0)
        else:
            lse2 = tl.load(lse2_ptrs)
            if DO_DK:
                delta = tl.load(delta_ptrs)
        # -- p^T (keys x queries) from the saved statistics --
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        p_t = tl.math.exp2(s_t - lse2[None, :])
        if MASKED:
            visible = (offs_n < kv_len)[:, None] & row_mask[None, :]
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= rows[None, :] + causal_offset)
            p_t = tl.where(visible, p_t, 0.0)
        if DO_DV:
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        if DO_DK:
            # -- ds^T = p^T * (dp^T - delta) --
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
        if not TMA and not ROWOFF:
            q_ptrs += BLOCK_M * step_q
            do_ptrs += BLOCK_M * step_do
        lse2_ptrs += BLOCK_M
        delta_ptrs += BLOCK_M
    return dk, dv


@triton.jit(do_not_specialize=["head_group"])  # a launch shape: no kernel variant per value
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, dout_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr, seq_lens_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_gz, stride_gh, stride_gm, stride_gd,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    num_heads, seq_len_q, seq_len_k,
    qk_scale, scale, head_group,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SEQ_LENS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, DO_DK: tl.constexpr, DO_DV: tl.constexpr,
    TMA: tl.constexpr, WS: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    ROWOFF: tl.constexpr, ROW32: tl.constexpr,
):
    """dk and dv of one key block (DO_DK and DO_DV), or one of them: a split backward launches this
    kernel twice so that each pass holds one (BLOCK_N, HEAD_DIM) fp32 accumulator, not two.
    TMA: the streamed q and dout tiles come through tensor descriptors. WS: the unmasked query loop is
    warp-specialized. EVEN_M / EVEN_N: as in the forward; full query blocks leave no masked tail loop,
    full key blocks of a non-causal kernel no masked first loop."""
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    pid_n, off_h, off_z = _tile(head_group, CAUSAL, False)  # causal: the first key blocks see the most queries
    q_len, kv_len = _valid_lengths(seq_lens_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS)
    causal_offset = seq_len_k - seq_len_q

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    if EVEN_N:
        kv_mask = None if EVEN_D else d_mask[None, :]
    else:
        kv_mask = (offs_n < kv_len)[:, None] & d_mask[None, :]

    k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    k = _load(k_base + _rows(offs_n, ROW32)[:, None] * stride_kn + offs_d[None, :] * stride_kd, kv_mask, UPCAST)
    if DO_DK:  # dv alone never reads v
        v = _load(v_base + _rows(offs_n, ROW32)[:, None] * stride_vn + offs_d[None, :] * stride_vd, kv_mask, UPCAST)
    else:
        v = k

    q_base = q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    do_base = dout_ptr + off_z.to(tl.int64) * stride_gz + off_h.to(tl.int64) * stride_gh
    q_ptrs = _streamed(q_base, q_len, stride_qm, stride_qd, offs_m, offs_d, HEAD_DIM, BLOCK_M, HEAD_DIM_PAD, False, TMA)
    do_ptrs = _streamed(do_base, q_len, stride_gm, stride_gd, offs_m, offs_d, HEAD_DIM, BLOCK_M, HEAD_DIM_PAD, False, TMA)
    row_base = (off_z * num_heads + off_h).to(tl.int64) * seq_len_q
    lse2_ptrs = lse2_ptr + row_base + offs_m
    delta_ptrs = delta_ptr + row_base + offs_m

    # -- query range: [lo, mid) masked (causal diagonal), [mid, full_end) unmasked, rest masked tail --
    if CAUSAL:
        lo = tl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M
        # rows i >= start_n + BLOCK_N - 1 - causal_offset see every key of this block
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0), BLOCK_M) * BLOCK_M
        mid = tl.maximum(mid, lo)
    else:
        lo = 0
        mid = 0
    # a partial key block masks every query block; a block of padding keys sees none (dk = dv = 0)
    mid = tl.where(start_n + BLOCK_N > kv_len, tl.cdiv(q_len, BLOCK_M) * BLOCK_M, mid)
    lo = tl.where(start_n >= kv_len, mid, lo)
    full_end = q_len // BLOCK_M * BLOCK_M

    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    if CAUSAL or not EVEN_N:  # else lo = mid = 0: nothing to mask before the unmasked loop
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptrs, do_ptrs, lse2_ptrs, delta_ptrs, stride_qm, stride_gm,
            offs_m, offs_n, d_mask, lo, tl.minimum(mid, q_len), q_len, kv_len, causal_offset, qk_scale,
            BLOCK_M, True, CAUSAL, EVEN_D, DOT_PRECISION, UPCAST, DO_DK, DO_DV, TMA, False, ROWOFF, ROW32,
        )
    dk, dv = _attn_bwd_dkdv_inner(
        dk, dv, k, v, q_ptrs, do_ptrs, lse2_ptrs, delta_ptrs, stride_qm, stride_gm,
        offs_m, offs_n, d_mask, mid, full_end, q_len, kv_len, causal_offset, qk_scale,
        BLOCK_M, False, CAUSAL, EVEN_D, DOT_PRECISION, UPCAST, DO_DK, DO_DV, TMA, WS, ROWOFF, ROW32,
    )
    if not EVEN_M:  # else full_end = q_len: no tail
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptrs, do_ptrs, lse2_ptrs, delta_ptrs, stride_qm, stride_gm,
            offs_m, offs_n, d_mask, tl.maximum(mid, full_end), q_len, q_len, kv_len, causal_offset, qk_scale,
            BLOCK_M, True, CAUSAL, EVEN_D, DOT_PRECISION, UPCAST, DO_DK, DO_DV, TMA, False, ROWOFF, ROW32,
        )

    key_in = kv_mask if EVEN_N else (offs_n < seq_len_k)[:, None] & d_mask[None, :]
    if DO_DK:
        dk *= scale  # s = scale * q.k, so ds/dk carries the natural scale
        dk_ptrs = (dk_ptr + off_z.to(tl.int64) * stride_dkz + off_h.to(tl.int64) * stride_dkh
                   + _rows(offs_n, ROW32)[:, None] * stride_dkn + offs_d[None, :] * stride_dkd)
        tl.store(dk_ptrs, dk.to(dk_ptr.dtype.element_ty), mask=key_in)
    if DO_DV:
        dv_ptrs = (dv_ptr + off_z.to(tl.int64) * stride_dvz + off_h.to(tl.int64) * stride_dvh
                   + _rows(offs_n, ROW32)[:, None] * stride_dvn + offs_d[None, :] * stride_dvd)
        tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=key_in)


@triton.jit
def _attn_bwd_dq_inner(
    dq, q, do, lse2, delta,
    k_ptrs, v_ptrs, step_k, step_v,
    offs_m, offs_n, d_mask,
    lo, hi, kv_len, causal_offset, qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
    ROWOFF: tl.constexpr, ROW32: tl.constexpr,
):
    """Accumulate dq of one query block over the key blocks [lo, hi). TMA: k_ptrs and v_ptrs are
    tensor descriptors. ROWOFF: as in _attn_fwd_inner."""
    if not TMA and not ROWOFF:
        k_ptrs += tl.cast(lo, tl.int64) * step_k
        v_ptrs += tl.cast(lo, tl.int64) * step_v
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        if MASKED:
            kv_mask = cols < kv_len
        k_at, v_at = _stepped(k_ptrs, v_ptrs, start_n, step_k, step_v, ROWOFF, ROW32)
        if TMA:
            k_t = _desc_load(k_ptrs, start_n, UPCAST).T  # (D, BLOCK_N)
            v_t = _desc_load(v_ptrs, start_n, UPCAST).T
        elif MASKED:
            k_t = _load(k_at, kv_mask[None, :] & d_mask[:, None], UPCAST)  # (D, BLOCK_N)
            v_t = _load(v_at, kv_mask[None, :] & d_mask[:, None], UPCAST)
        else:
            k_t = _load(k_at, None if EVEN_D else d_mask[:, None], UPCAST)
            v_t = _load(v_at, None if EVEN_D else d_mask[:, None], UPCAST)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            visible = kv_mask[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, v_t, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=DOT_PRECISION)
        if not TMA and not ROWOFF:
            k_ptrs += BLOCK_N * step_k
            v_ptrs += BLOCK_N * step_v
    return dq


@triton.jit(do_not_specialize=["head_group"])  # a launch shape: no kernel variant per value
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, dout_ptr, lse2_ptr, delta_ptr, dq_ptr, seq_lens_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_gz, stride_gh, stride_gm, stride_gd,
    stride_dqz, stride_dqh, stride_dqm, stride_dqd,
    num_heads, seq_len_q, seq_len_k,
    qk_scale, scale, head_group,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SEQ_LENS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr,
):
    """dq of one query block. TMA: the streamed k and v tiles come through tensor descriptors.
    WS: the unmasked key loop is warp-specialized. EVEN_M / EVEN_N: as in the forward."""
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    pid_m, off_h, off_z = _tile(head_group, CAUSAL, CAUSAL)
    q_len, kv_len = _valid_lengths(seq_lens_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS)
    causal_offset = seq_len_k - seq_len_q

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    if EVEN_M:
        row_mask = None
        qd_mask = None if EVEN_D else d_mask[None, :]
    else:
        row_mask = offs_m < q_len
        qd_mask = row_mask[:, None] & d_mask[None, :]

    q = _load(q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
              + _rows(offs_m, ROW32)[:, None] * stride_qm + offs_d[None, :] * stride_qd, qd_mask, UPCAST)
    do = _load(dout_ptr + off_z.to(tl.int64) * stride_gz + off_h.to(tl.int64) * stride_gh
               + _rows(offs_m, ROW32)[:, None] * stride_gm + offs_d[None, :] * stride_gd, qd_mask, UPCAST)
    row_base = (off_z * num_heads + off_h).to(tl.int64) * seq_len_q
    if EVEN_M:
        lse2 = tl.load(lse2_ptr + row_base + offs_m)
        delta = tl.load(delta_ptr + row_base + offs_m)
    else:
        lse2 = tl.load(lse2_ptr + row_base + offs_m, mask=row_mask, other=float("inf"))
        delta = tl.load(delta_ptr + row_base + offs_m, mask=row_mask, other=0.0)

    k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    k_ptrs = _streamed(k_base, kv_len, stride_kn, stride_kd, offs_n, offs_d, HEAD_DIM, BLOCK_N, HEAD_DIM_PAD, True, TMA)
    v_ptrs = _streamed(v_base, kv_len, stride_vn, stride_vd, offs_n, offs_d, HEAD_DIM, BLOCK_N, HEAD_DIM_PAD, True, TMA)

    full_hi, hi = _key_range(start_m, q_len, kv_len, causal_offset, BLOCK_M, BLOCK_N, CAUSAL, HAS_SEQ_LENS, EVEN_N)

    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
        offs_m, offs_n, d_mask, 0, full_hi, kv_len, causal_offset, qk_scale,
        BLOCK_N, False, CAUSAL, EVEN_D, DOT_PRECISION, UPCAST, TMA, WS, ROWOFF, ROW32,
    )
    if CAUSAL or not EVEN_N:  # else full_hi = hi = N_k: no masked key block
        dq = _attn_bwd_dq_inner(
            dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
            offs_m, offs_n, d_mask, full_hi, hi, kv_len, causal_offset, qk_scale,
            BLOCK_N, True, CAUSAL, EVEN_D, DOT_PRECISION, UPCAST, TMA, False, ROWOFF, ROW32,
        )
    dq *= scale

    dq_ptrs = (dq_ptr + off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh
               + _rows(offs_m, ROW32)[:, None] * stride_dqm + offs_d[None, :] * stride_dqd)
    if EVEN_M:
        tl.store(dq_ptrs, dq.to(dq_ptr.dtype.element_ty), mask=qd_mask)
    else:
        tl.store(dq_ptrs, dq.to(dq_ptr.dtype.element_ty), mask=(offs_m < seq_len_q)[:, None] & d_mask[None, :])


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------
# Each kernel launches through its DirectLauncher: the JIT's binding once per call signature, then
# the compiled kernel directly (~20 us less host time per launch; _launch.py). On top of that, a call
# whose inputs were seen before (same dtypes, shapes, strides, 16-byte alignment, options) replays a
# plan: the launches it made the first time, bound to their compiled kernels, fed this call's tensors.
# That skips choosing tiles, checking TMA, computing strides and every launch's signature: the host
# cost that dominates a short sequence (a backward is four launches).
_FWD = DirectLauncher(_attn_fwd_kernel)
_BWD_PRE = DirectLauncher(_attn_bwd_preprocess_kernel)
_BWD_DKDV = DirectLauncher(_attn_bwd_dkdv_kernel)
_BWD_DQ = DirectLauncher(_attn_bwd_dq_kernel)
INTERPRETED = _FWD.interpreted  # fixed when the kernels were decorated, as Triton decides it


class _Launch(NamedTuple):
    """One kernel launch of a call: its leading pointer arguments by name (looked up in the call's
    tensors), then every other argument."""

    launcher: DirectLauncher
    grid: tuple
    pointers: tuple[str, ...]
    args: tuple
    meta: dict


class _Plan(NamedTuple):
    launches: tuple[tuple[BoundLaunch, tuple[str, ...]], ...]
    tma: bool  # some launch builds TMA descriptors on the device: Triton needs a scratch allocator
    descs: tuple = ()  # (name, block_rows, block_cols): tensors the launches read through host descriptors


_PLANS: dict[tuple, _Plan] = {}
MAX_PLANS = 4096  # a workload with ever-new shapes starts over instead of growing


def _layout(t: torch.Tensor | None):
    # everything a launch specializes on per tensor (Triton: dtype, alignment; ours: shape, strides)
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() % 16 == 0)


def _plan_key(kind: str, inputs: tuple, causal: bool, scale: float, overrides: tuple = (None, None)) -> tuple | None:
    """The key of a call's plan, or None where there is no plan: under the interpreter (no compiled
    kernels) and for batches that need more than one grid (MAX_GRID_Z). `overrides`: the call's
    explicit (config, group), so that a benchmark of given tiles replays a plan as users' calls do and
    times the kernels, not the host path that picks tiles."""
    if INTERPRETED or not inputs[0].is_cuda or inputs[0].shape[0] > MAX_GRID_Z:
        return None
    return (kind, causal, scale, inputs[0].device, torch.cuda.current_device(), *runtime_key(), *map(_layout, inputs),
            *overrides)


def _aligned(*outputs: torch.Tensor) -> bool:
    # fresh allocations: the caching allocator's blocks are 512-byte aligned, but a plan assumes nothing
    return all(t.data_ptr() % 16 == 0 for t in outputs)


def _launch(chunks, key: tuple | None, tma: bool, descs: tuple = ()) -> None:
    """Run each chunk's launches ([(tensors by name, [_Launch, ...]), ...]) through the launchers, and
    remember them as the plan of `key` when there was one chunk and every launch has a compiled kernel.
    descs: (name, block_rows, block_cols) of the tensors read through host descriptors (host_descriptor),
    which each chunk's tensors become here."""
    if tma:
        ensure_scratch_allocator()
    if descs:
        chunks = [(_with_descriptors(env, descs), launches) for env, launches in chunks]
    for env, launches in chunks:
        for lc in launches:
            lc.launcher(lc.grid, *(env[name] for name in lc.pointers), *lc.args, **lc.meta)
    if key is None or len(chunks) != 1:
        return
    env, launches = chunks[0]
    bound = []
    for lc in launches:
        b = lc.launcher.bind(lc.grid, tuple(env[name] for name in lc.pointers), lc.args, lc.meta)
        if b is None:
            return
        bound.append((b, lc.pointers))
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = _Plan(tuple(bound), tma, descs)


def _replay(plan: _Plan, env: dict) -> None:
    if plan.tma:
        ensure_scratch_allocator()  # per thread: autograd's backward thread starts without one
    if plan.descs:
        env = _with_descriptors(env, plan.descs)
    for bound, names in plan.launches:
        bound(*(env[name] for name in names))


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """(BH, N, D) -> (BH, 1, N, D) view; 4-D passes through. Never copies."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def _strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    return tuple(t.stride())  # type: ignore[return-value]


def _z_chunks(z: int, env: dict) -> list[tuple[int, dict]]:
    """CUDA caps a grid's z dimension at 65535: launch larger batches in slices along dim 0 (views,
    no copy). Returns [(z_count, tensors by name, sliced), ...]; a single chunk keeps the tensors."""
    if z <= MAX_GRID_Z:
        return [(z, env)]
    return [(min(z, z0 + MAX_GRID_Z) - z0,
             {name: t[z0:z0 + MAX_GRID_Z] if t is not None else None for name, t in env.items()})
            for z0 in range(0, z, MAX_GRID_Z)]


def rows_fit_int32(*tensors: torch.Tensor) -> bool:
    """Whether every offset inside one (batch, head) slice of these (Z, H, N, D) tensors that a tile can
    form fits in int32: row * row_stride + col * col_stride for rows up to N + MAX_BLOCK_ROWS (a last
    block's padding rows have addresses too, masked) and columns up to the padded head_dim. The kernels
    then compute row offsets in 32 bits (ROW32, _rows); the (batch, head) offsets are 64-bit either way."""
    return all((t.shape[2] + MAX_BLOCK_ROWS) * abs(t.stride(2)) + head_dim_pad(t.shape[3]) * abs(t.stride(3)) < 2**31
               for t in tensors)


def host_descriptor(t: torch.Tensor, block_rows: int, block_cols: int) -> TensorDescriptor:
    """A TMA descriptor over a whole (Z, H, N, D) tensor (a (Z*H, N, D) one as (Z*H, 1, N, D)) in
    (1, 1, block_rows, block_cols) blocks; the kernels load slice (z, h)'s tile at row r as [z, h, r, 0]
    (_desc_load4). Built once per launch on the host, where each program would otherwise build its
    slice's descriptor in global memory (tl.make_tensor_descriptor): D128 N1024 forward in a minimal
    kernel, 400 -> 424 TFLOPS on the H200. The hardware needs every stride 16-byte aligned: a size-1
    dimension's stride never moves the address, so it is given a dense one. Needs tma_ok and
    host_descriptors_ok."""
    if t.dim() == 3:
        (z, n, d), (sz, sn, _) = t.shape, t.stride()
        h, sh = 1, 0
    else:
        (z, h, n, d), (sz, sh, sn, _) = t.shape, t.stride()
    sn = sn if n > 1 else d
    sh = sh if h > 1 else n * sn
    sz = sz if z > 1 else h * sh
    return TensorDescriptor(t, [z, h, n, d], [sz, sh, sn, 1], [1, 1, block_rows, block_cols])


# Host descriptors cost host time, per launch: three TensorDescriptor objects and Triton's encoding of
# each (cuTensorMapEncodeTiled), ~18 us on the H200 host (bench/overhead.py: a D128 TMA launch 42 against
# 24 us). They save each program building its own (D128 N1024: ~4.5 us of an 84 us kernel). Calls with
# less work than this (Z*H*N_q*N_k*padded head_dim; 2^32 is a ~40 us kernel) keep the per-program ones:
# a short call is bound by host time, and short-sequence cells measured 30 -> 45 us with host descriptors.
HOST_DESC_MIN_WORK = 1 << 32


def host_descriptors_ok(*tensors: torch.Tensor) -> bool:
    """Whether host_descriptor can describe these tma_ok tensors: no stride 0 where a dimension has
    more than one element (an expanded, broadcast view: TMA strides must be positive). Such inputs read
    through the per-program descriptors instead."""
    return all(stride != 0 or size == 1 for t in tensors for size, stride in zip(t.shape, t.stride()))


def _with_descriptors(env: dict, descs: tuple) -> dict:
    return {**env, **{name: host_descriptor(env[name], rows, cols) for name, rows, cols in descs}}


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can read these (Z, H, N, D) tensors in place: fp16/bf16, head_dim
    contiguous, every other stride and the base address 16-byte aligned (strides of size-1 dims
    never move the address), on a GPU of compute capability 9.0 or newer. Under Triton's interpreter
    (CPU tensors) the descriptors are emulated, so tests run the TMA path there too."""
    for t in tensors:
        if t.dtype not in (torch.float16, torch.bfloat16) or t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any(size > 1 and stride * t.element_size() % 16 for size, stride in zip(t.shape[:-1], t.stride()[:-1])):
            return False
    device = tensors[0].device
    return device_limits(device).tma if device.type == "cuda" else INTERPRETED


# Tiles a head group of a causal kernel holds, per SM: two, about one wave of resident programs.
# Measured on the H200 (bench/probes/attention_groups.py, bench/results/attention_groups_h200.jsonl): with
# head groups of 1..128 at D 64/128/256 and N 2048..16384, the fastest group held 128-512 tiles in
# every shape, and ~256 was within noise of the best everywhere. A group of one wave starts its heads'
# heavy tiles together and drains on light ones while the next group starts; larger groups spread
# over more heads than L2 holds, groups that do not divide the heads leave a short group for the end.
GROUP_TILES_PER_SM = 2


def head_group(causal: bool, num_tiles: int, num_bh: int, device: torch.device) -> int:
    """How many heads a kernel's tiles are dealt over at once (_tile): for causal kernels, whose tiles
    differ in work, the most heads that divide the batch's heads evenly and hold at most
    GROUP_TILES_PER_SM tiles (`num_tiles` per head) per SM together; other kernels go head after head."""
    sms = device_limits(device).sms
    if not causal or not sms:
        return 1
    group = max(1, min(num_bh, GROUP_TILES_PER_SM * sms // num_tiles))
    while num_bh % group:
        group -= 1
    return group


def _tile_meta(cfg: AttnConfig, tma: bool, seq_lens: torch.Tensor | None, n_q: int, n_k: int, row32: bool) -> dict:
    """A kernel's launch options from its tiles: blocks, warps, stages, TMA (where the inputs allow it,
    `tma`), warp specialization (with TMA only) and EVEN_M / EVEN_N: every query / key block of these
    tiles is full, so rows and keys need no masks (never with seq_lens, whose valid lengths are only
    known on the device); ROWOFF (the tiles' rowoff) and ROW32 (`row32`: rows_fit_int32 of the launch's
    tensors, so row offsets are computed in 32 bits, unless the tiles ask for 64: row64)."""
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                TMA=tma, WS=tma and cfg.ws, ROWOFF=cfg.rowoff, ROW32=row32 and not cfg.row64,
                EVEN_M=seq_lens is None and n_q % cfg.block_m == 0,
                EVEN_N=seq_lens is None and n_k % cfg.block_n == 0)


def vote_rows(cfg: AttnConfig, d_pad: int) -> int:
    """The accumulator rows each thread of a forward with these tiles holds (_warp_any's pack), or 0
    where lazy rescaling cannot skip by a branch and multiplies as usual: tiles whose warps do not stack
    along the rows (AttnConfig.stacked_rows), a row count _warp_any has no vote for, or a thread's
    accumulator elements not a multiple of the rescale's 32-element asm blocks. Tests
    (test_lazy_rescaling_*) check on the GPU that every row's rescale is kept where it is needed."""
    rows = cfg.stacked_rows
    per_thread = cfg.block_m * d_pad // (32 * cfg.num_warps)
    if rows not in VOTE_PACKS or per_thread % _RESCALE_N:
        return 0
    return rows


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must stay fp32-accurate: no TF32. fp16/bf16 ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def _upcast(dtype: torch.dtype) -> bool:
    # the interpreter's bf16 tl.dot is wrong (triton-lang/triton#11584): widen the tiles there
    return dtype == torch.bfloat16 and INTERPRETED


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    seq_lens: torch.Tensor | None,
    config: AttnConfig | None = None,
    group: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward. q: (Z, H, N_q, D) or (Z, N_q, D); k, v: same with N_k. Returns
    (out, lse): out = torch.empty_like(q) (so q's memory layout), lse fp32 (..., N_q) contiguous.
    config and group (the head group, see head_group) override the tuned choices, for benchmarks."""
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    env = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "seq_lens": seq_lens}
    key = _plan_key("fwd", (q, k, v, seq_lens), causal, scale, (config, group))
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None and _aligned(out, lse):
        _replay(plan, env)
        return out, lse

    q4, k4, v4, o4 = _as_4d(q), _as_4d(k), _as_4d(v), _as_4d(out)
    lse3 = lse.unsqueeze(1) if q.dim() == 3 else lse
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    d_pad = head_dim_pad(d)
    cfg = config or fwd_config(d_pad, q.dtype, q.device, causal, INTERPRETED, max(n_q, n_k))
    tma = cfg.tma and tma_ok(q4, k4, v4)
    # descriptors built on the host where one per tensor serves every program: not with seq_lens, whose
    # per-program descriptors end at each sequence's valid length, nor for short calls (HOST_DESC_MIN_WORK)
    host_desc = (tma and seq_lens is None and z * h * n_q * n_k * d_pad >= HOST_DESC_MIN_WORK
                 and host_descriptors_ok(q4, k4, v4))
    env = {"q": q4, "k": k4, "v": v4, "out": o4, "lse": lse3, "seq_lens": seq_lens}
    group = group or head_group(causal, cdiv(n_q, cfg.block_m), z * h, q.device)
    args = (*_strides(q4), *_strides(k4), *_strides(v4), *_strides(o4), lse3.stride(0), lse3.stride(1),
            h, n_q, n_k, scale * LOG2E, group)
    meta = dict(
        HEAD_DIM=d, HEAD_DIM_PAD=d_pad,
        CAUSAL=causal, HAS_SEQ_LENS=seq_lens is not None, FOLD_SCALE=scale > 0,
        DOT_PRECISION=_dot_precision(q.dtype), UPCAST=_upcast(q.dtype), HOST_DESC=host_desc,
        LAZY=cfg.lazy, VOTE_ROWS=vote_rows(cfg, d_pad) if cfg.lazy and not INTERPRETED else 0,
        **_tile_meta(cfg, tma, seq_lens, n_q, n_k, rows_fit_int32(q4, k4, v4, o4)),
    )
    pointers = ("q", "k", "v", "out", "lse", "seq_lens")
    chunks = [(env_, [_Launch(_FWD, (cdiv(n_q, cfg.block_m), h, zc), pointers, args, meta)])
              for zc, env_ in _z_chunks(z, env)]
    descs = (("q", cfg.block_m, d_pad), ("k", cfg.block_n, d_pad), ("v", cfg.block_n, d_pad)) if host_desc else ()
    # the interpreter emulates descriptors without scratch memory; host descriptors need none
    _launch(chunks, key if _aligned(out, lse) else None, tma and not host_desc and q.is_cuda, descs)
    return out, lse


def attention_bwd(
    dout: torch.Tensor,
    dlse: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    seq_lens: torch.Tensor | None,
    config: BwdConfig | None = None,
    group: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward from the forward's out and lse. dout may have any strides (stride 0 too).
    Returns (dq, dk, dv) allocated with empty_like(q/k/v). config and group (the head group of both
    kernels, see head_group) override the tuned choices, for benchmarks."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_q == 0 or n_k == 0 or q.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    # per-row statistics of the backward, fp32 (Z, H, N_q): delta = rowsum(dout * out) - dlse, lse2 = lse * log2(e)
    delta = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    env = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse, "dlse": dlse, "delta": delta,
           "lse2": lse2, "dq": dq, "dk": dk, "dv": dv, "seq_lens": seq_lens}
    key = _plan_key("bwd", (q, k, v, out, dout, lse, dlse, seq_lens), causal, scale, (config, group))
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None and _aligned(dq, dk, dv, delta, lse2):
        _replay(plan, env)
        return dq, dk, dv

    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    o4, g4 = _as_4d(out), _as_4d(dout)
    dq4, dk4, dv4 = _as_4d(dq), _as_4d(dk), _as_4d(dv)
    lse3 = lse.unsqueeze(1) if q.dim() == 3 else lse
    dlse3 = None if dlse is None else dlse.unsqueeze(1) if q.dim() == 3 else dlse
    delta3 = delta.unsqueeze(1) if q.dim() == 3 else delta
    lse23 = lse2.unsqueeze(1) if q.dim() == 3 else lse2
    z, h, _, d = q4.shape
    d_pad = head_dim_pad(d)
    cfg = config or bwd_config(d_pad, q.dtype, q.device, causal, INTERPRETED, max(n_q, n_k))
    if any(c is not None and c.lazy for c in cfg):
        raise ValueError(f"{cfg}: lazy (rescaling) is a forward flag; the backward keeps no running max")
    q_cfg = cfg.dq
    kv_passes = cfg.dkdv_passes()  # one pass for dk and dv, or (split) a dv pass then a dk pass
    # TMA per kernel: dk/dv streams q and dout tiles, dq streams k and v tiles
    kv_tma_ok = any(kv_cfg.tma for kv_cfg, _, _ in kv_passes) and tma_ok(q4, g4)
    kv_tma = [kv_cfg.tma and kv_tma_ok for kv_cfg, _, _ in kv_passes]
    q_tma = q_cfg.tma and tma_ok(k4, v4)
    env = {"q": q4, "k": k4, "v": v4, "out": o4, "dout": g4, "lse": lse3, "dlse": dlse3, "delta": delta3,
           "lse2": lse23, "dq": dq4, "dk": dk4, "dv": dv4, "seq_lens": seq_lens}
    common = dict(HEAD_DIM=d, HEAD_DIM_PAD=d_pad, CAUSAL=causal, HAS_SEQ_LENS=seq_lens is not None,
                  DOT_PRECISION=_dot_precision(q.dtype), UPCAST=_upcast(q.dtype))
    pre_block = 64
    pre_args = (*_strides(o4), *_strides(g4), *lse3.stride(),
                *(dlse3.stride() if dlse3 is not None else (0, 0, 0)),
                h, n_q)
    pre_meta = dict(HEAD_DIM=d, HEAD_DIM_PAD=d_pad, BLOCK_M=pre_block, HAS_DLSE=dlse3 is not None)
    row32 = rows_fit_int32(q4, k4, v4, g4, dq4, dk4, dv4)
    kv_strides = (*_strides(q4), *_strides(k4), *_strides(v4), *_strides(g4), *_strides(dk4), *_strides(dv4))
    kv_launches = [  # (tiles, args, meta) of each dk/dv pass
        (kv_cfg,
         (*kv_strides, h, n_q, n_k, scale * LOG2E, scale,
          group or head_group(causal, cdiv(n_k, kv_cfg.block_n), z * h, q.device)),
         dict(DO_DK=do_dk, DO_DV=do_dv, **_tile_meta(kv_cfg, tma, seq_lens, n_q, n_k, row32), **common))
        for (kv_cfg, do_dk, do_dv), tma in zip(kv_passes, kv_tma)
    ]
    q_group = group or head_group(causal, cdiv(n_q, q_cfg.block_m), z * h, q.device)
    q_args = (*_strides(q4), *_strides(k4), *_strides(v4), *_strides(g4), *_strides(dq4),
              h, n_q, n_k, scale * LOG2E, scale, q_group)
    q_meta = dict(**_tile_meta(q_cfg, q_tma, seq_lens, n_q, n_k, row32), **common)

    def launches(zc: int) -> list[_Launch]:
        return [
            _Launch(_BWD_PRE, (cdiv(n_q, pre_block), h, zc), ("out", "dout", "lse", "dlse", "delta", "lse2"),
                    pre_args, pre_meta),
            *(_Launch(_BWD_DKDV, (cdiv(n_k, kv_cfg.block_n), h, zc),
                      ("q", "k", "v", "dout", "lse2", "delta", "dk", "dv", "seq_lens"), kv_args, kv_meta)
              for kv_cfg, kv_args, kv_meta in kv_launches),
            _Launch(_BWD_DQ, (cdiv(n_q, q_cfg.block_m), h, zc),
                    ("q", "k", "v", "dout", "lse2", "delta", "dq", "seq_lens"), q_args, q_meta),
        ]

    chunks = [(env_, launches(zc)) for zc, env_ in _z_chunks(z, env)]
    _launch(chunks, key if _aligned(dq, dk, dv, delta, lse2) else None, (any(kv_tma) or q_tma) and q.is_cuda)
    return dq, dk, dv
