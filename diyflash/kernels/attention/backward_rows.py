"""The backward's row passes around its main kernels (backward.py): the preprocess (delta, lse2 and the
zeros of the fp32 dq accumulator), the sum of a kv head's dk/dv partials (head_split), and the conversion
of the accumulated dq to its dtype (the one-pass backward, DQ_ATOMIC)."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)

from .semantics import LOG2E, _stats_shifted, _unprescale  # noqa: E402


@triton.jit
def _attn_bwd_preprocess_kernel(
    out_ptr, dout_ptr, lse_ptr, dlse_ptr, delta_ptr, lse2_ptr, dq_acc_ptr,
    stride_oz, stride_oh, stride_om, stride_od,
    stride_gz, stride_gh, stride_gm, stride_gd,
    stride_lz, stride_lh, stride_lm,
    stride_dlz, stride_dlh, stride_dlm,
    num_heads, seq_len_q, stat_stride, dq_rows, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr, HEAD_DIM_Q: tl.constexpr, HEAD_DIM_Q_PAD: tl.constexpr,
    SHIFTED: tl.constexpr,
):
    """delta and lse2 of BLOCK_M query rows of one head ((Z, H, stat_stride) fp32: N_q rows a head, or the
    Hopper backward's N_q rounded up to 4, whose TMA reads need 16-byte aligned rows); ZERO_DQ: also the
    zeros of the rows' fp32 dq accumulator (contiguous (Z, H, dq_rows, HEAD_DIM_Q)), which the dk/dv kernel's
    atomic adds then fill (DQ_ATOMIC), so that no separate fill runs: dq_rows N_q, or the Hopper backward's
    hopper.bwd_dq_rows (its padding rows too, which the grid's last block covers). SHIFTED: -lse2 / qk_rest
    and -delta instead (semantics._stats_shifted of qk_scale), as the Hopper backward with STATS_ACC takes them."""
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
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    # rows N_q .. stat_stride (the Hopper backward's padding, which its TMA reads): delta 0 and lse2 +inf, so that
    # p and ds are 0 there, not a product with an unwritten value
    if SHIFTED:
        lse2, delta = _stats_shifted(lse2, delta, qk_scale, DTYPE=out_ptr.dtype.element_ty)
    head = (off_z * num_heads + off_h).to(tl.int64)
    tl.store(delta_ptr + head * stat_stride + offs_m, delta, mask=offs_m < stat_stride)
    tl.store(lse2_ptr + head * stat_stride + offs_m, lse2, mask=offs_m < stat_stride)
    if ZERO_DQ:
        row_off = head * dq_rows + offs_m
        offs_q = tl.arange(0, HEAD_DIM_Q_PAD)
        tl.store(dq_acc_ptr + row_off[:, None] * HEAD_DIM_Q + offs_q[None, :],
                 tl.zeros([BLOCK_M, HEAD_DIM_Q_PAD], dtype=tl.float32),
                 mask=(offs_m < dq_rows)[:, None] & (offs_q < HEAD_DIM_Q)[None, :])


@triton.jit
def _attn_bwd_group_sum_kernel(
    dk_part_ptr, dv_part_ptr, dk_ptr, dv_ptr,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    num_kv_heads, seq_len_k, head_split,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dk and dv of one key block of one kv head where the dk/dv kernel split the head's query group over
    head_split programs: the sum of their fp32 partials (contiguous (Z, H_kv * head_split, N_k, D) and
    (..., D_v)), part after part in a fixed order, so the result is deterministic. Grid (key blocks,
    kv heads, batch)."""
    off_hk = tl.program_id(1)
    off_z = tl.program_id(2)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    key_in = (offs_n < seq_len_k)[:, None]
    k_mask = key_in & (offs_d < HEAD_DIM)[None, :]
    v_mask = key_in & (offs_dv < HEAD_DIM_V)[None, :]
    first = (off_z * num_kv_heads + off_hk).to(tl.int64) * head_split  # the kv head's part 0
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V_PAD], dtype=tl.float32)
    for part in range(0, head_split):
        part_rows = ((first + part) * seq_len_k + offs_n)[:, None]  # 64-bit (seq_len_k may be a constant 1)
        dk += tl.load(dk_part_ptr + part_rows * HEAD_DIM + offs_d[None, :], mask=k_mask, other=0.0)
        dv += tl.load(dv_part_ptr + part_rows * HEAD_DIM_V + offs_dv[None, :], mask=v_mask, other=0.0)
    rows = offs_n.to(tl.int64)[:, None]
    tl.store(dk_ptr + off_z.to(tl.int64) * stride_dkz + off_hk.to(tl.int64) * stride_dkh + rows * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(dk_ptr.dtype.element_ty), mask=k_mask)
    tl.store(dv_ptr + off_z.to(tl.int64) * stride_dvz + off_hk.to(tl.int64) * stride_dvh + rows * stride_dvn
             + offs_dv[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=v_mask)


@triton.jit
def _dq_flat_offset(r, d, HEAD_DIM: tl.constexpr):
    """Where element (r, d) of a 64-row dq tile sits in the Hopper backward's flat accumulator tile
    (backward_sm90._store_dq writes it): each MMA warpgroup's D/2 columns a chunk of 64 * D/2 floats, element
    (r, c) of a chunk at (c // 8) * 512 + (32 * (r // 16) + 4 * (r % 8) + c % 8 // 2) * 4 + 2 * (r // 8 % 2)
    + c % 2 (its wgmma accumulator registers' order)."""
    H2: tl.constexpr = HEAD_DIM // 2
    w = d // H2
    c = d % H2
    return (w * (64 * H2) + (c // 8) * 512 + (32 * (r // 16) + 4 * (r % 8) + c % 8 // 2) * 4
            + 2 * (r // 8 % 2) + c % 2)


@triton.jit
def _attn_bwd_dq_convert_kernel(
    dq_acc_ptr, dq_ptr,
    stride_dqz, stride_dqh, stride_dqm, stride_dqd,
    num_heads, seq_len_q, dq_rows, scale, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, FLAT: tl.constexpr,
    UNPRESCALE: tl.constexpr,
):
    """dq of BLOCK_M query rows of one head from the fp32 accumulator (contiguous (Z, H, dq_rows, HEAD_DIM))
    the dk/dv kernel's atomic adds filled (dq_rows N_q), or FLAT the Hopper backward's TMA reduces (dq_rows:
    hopper.bwd_dq_rows, each 64-row tile in _dq_flat_offset's order, BLOCK_M = 64): times the natural scale, in dq's
    dtype and strides. UNPRESCALE (the Hopper backward, which adds ds . k with k prescaled by qk_scale's
    power of two, semantics._prescaled, k of dq's dtype): times that power's inverse too, exact, so the same
    bits as scaling each tile before its add. Grid (row blocks, heads, batch), as the preprocess kernel's."""
    off_h = tl.program_id(1)
    off_z = tl.program_id(2)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_m < seq_len_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    head = (off_z * num_heads + off_h).to(tl.int64)
    if FLAT:
        tl.static_assert(BLOCK_M == 64, "the flat accumulator's tiles are 64 rows (_dq_flat_offset)")
        tile = (head * dq_rows + tl.program_id(0) * BLOCK_M) * HEAD_DIM
        at = tile + _dq_flat_offset(tl.arange(0, BLOCK_M)[:, None], offs_d[None, :], HEAD_DIM=HEAD_DIM)
    else:
        at = (head * dq_rows + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    dq = tl.load(dq_acc_ptr + at, mask=mask, other=0.0)
    if UNPRESCALE:
        scale = scale * _unprescale(qk_scale, DTYPE=dq_ptr.dtype.element_ty)
    tl.store(dq_ptr + off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh
             + offs_m.to(tl.int64)[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=mask)
