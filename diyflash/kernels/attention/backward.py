"""The backward's main kernels, after the preprocess (backward_rows.py: delta = rowsum(dout * out) - dlse):
a dk/dv kernel (one program per key block; GQA on a small grid: per key block and part of the query-head
group, then a sum of the parts) and either

- a dq kernel (one program per query block): each output element is written by exactly one program in a
  fixed loop order, no atomics, so gradients are bitwise deterministic (7 dots a tile pair: the dq kernel
  recomputes the scores and dp); or
- (DQ_ATOMIC: the one-pass backward, where launch_bwd.ONE_PASS runs it and the call allows it) dq from the dk/dv
  kernel itself: each tile pair adds ds . k to an fp32 accumulator (atomic adds, or one TMA bulk reduce a
  tile; 5 dots a tile pair), and a row pass converts it (backward_rows.py). The order of the adds varies
  from run to run, so dq may differ by a few ulps."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)

from .semantics import (_band, _inv, _prescaled, _probs, _query_band, _scores, _sequence, _slope,  # noqa: E402
                        _unprescale, _visible)
from .tile_order import _tile  # noqa: E402
from .tiles import _desc_load, _load, _rows, _rows_desc, _stepped, _streamed  # noqa: E402


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v,
    q_ptrs, do_ptrs, lse2_ptrs, delta_ptrs, dq_ptrs, step_q, step_do,
    offs_m, offs_n, d_mask, dv_mask,
    lo, hi, q_len, kv_len, causal_offset, qk_scale, dq_unscale,
    win_left, win_right, cap2, inv_cap2, slope2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, DO_DK: tl.constexpr, DO_DV: tl.constexpr,
    DQ_ATOMIC: tl.constexpr,
    TMA: tl.constexpr, WS: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
):
    """Accumulate dk, dv of one key block over the query blocks [lo, hi). Works transposed
    (keys x queries) so that p^T and ds^T come straight out of the dots. DO_DK / DO_DV: which of the
    two this pass accumulates (a split pass skips the other's dots and loads). DQ_ATOMIC (with DO_DK):
    also add each query block's share of dq, ds . k times dq_unscale (k is held prescaled), to the fp32
    rows at dq_ptrs (HEAD_DIM wide). TMA: q_ptrs and do_ptrs are tensor descriptors, and so is dq_ptrs
    (a bulk reduce a tile instead of an atomic add an element). ROWOFF: as in
    _attn_fwd_inner."""
    if not TMA and not ROWOFF:
        q_ptrs += tl.cast(lo, tl.int64) * step_q
        do_ptrs += tl.cast(lo, tl.int64) * step_do
    lse2_ptrs += lo
    delta_ptrs += lo
    if DQ_ATOMIC and not TMA:
        dq_ptrs += tl.cast(lo, tl.int64) * HEAD_DIM
    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WS):
        rows = start_m + offs_m
        if MASKED:
            row_mask = rows < q_len
        q_at, do_at = _stepped(q_ptrs, do_ptrs, start_m, step_q, step_do, ROWOFF=ROWOFF, ROW32=ROW32)
        if TMA:
            q = _desc_load(q_ptrs, start_m, UPCAST=UPCAST)
            do = _desc_load(do_ptrs, start_m, UPCAST=UPCAST)
        elif MASKED:
            q = _load(q_at, row_mask[:, None] & d_mask[None, :], UPCAST=UPCAST)
            do = _load(do_at, row_mask[:, None] & dv_mask[None, :], UPCAST=UPCAST)
        else:
            q = _load(q_at, None if EVEN_D else d_mask[None, :], UPCAST=UPCAST)
            do = _load(do_at, None if EVEN_DV else dv_mask[None, :], UPCAST=UPCAST)
        if MASKED:
            lse2 = tl.load(lse2_ptrs, mask=row_mask, other=float("inf"))
            if DO_DK:
                delta = tl.load(delta_ptrs, mask=row_mask, other=0.0)
        else:
            lse2 = tl.load(lse2_ptrs)
            if DO_DK:
                delta = tl.load(delta_ptrs)
        # -- p^T (keys x queries) from the saved statistics --
        s_t, t_t = _scores(
            tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION), rows[None, :], offs_n[:, None], causal_offset,
            qk_scale, cap2, inv_cap2, slope2, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
        p_t = _probs(s_t, lse2[None, :])
        if MASKED:
            visible = _visible(
                rows[None, :], offs_n[:, None], kv_len, causal_offset, win_left, win_right, KEY_MASK=True,
                CAUSAL=CAUSAL, WINDOW=WINDOW,
            ) & row_mask[None, :]
            p_t = tl.where(visible, p_t, 0.0)
        if DO_DV:
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        if DO_DK:
            # -- ds^T = p^T * (dp^T - delta) --
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
            ds_t = p_t * (dp_t - delta[None, :])
            if SOFTCAP:  # d(cap * tanh(x / cap)) / dx = 1 - tanh^2
                ds_t = ds_t * (1.0 - t_t * t_t)
            ds_t = ds_t.to(q.dtype)
            dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
            if DQ_ATOMIC:
                dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION) * dq_unscale
                if TMA:  # one bulk reduce of the tile (rows past q_len and columns past HEAD_DIM clipped)
                    dq_ptrs.atomic_add([start_m, 0], dq)
                else:
                    if MASKED:
                        dq_mask = row_mask[:, None] & d_mask[None, :]
                    else:
                        dq_mask = None if EVEN_D else d_mask[None, :]
                    tl.atomic_add(dq_ptrs, dq, mask=dq_mask, sem="relaxed")
        if not TMA and not ROWOFF:
            q_ptrs += BLOCK_M * step_q
            do_ptrs += BLOCK_M * step_do
        lse2_ptrs += BLOCK_M
        delta_ptrs += BLOCK_M
        if DQ_ATOMIC and not TMA:
            dq_ptrs += BLOCK_M * HEAD_DIM
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_head(
    dk, dv, k, v, q_ptr, dout_ptr, lse2_ptr, delta_ptr, dq_acc_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_gz, stride_gh, stride_gm, stride_gd,
    off_z, off_h, num_heads, seq_len_q, q_start, q_len, kv_len, causal_offset, start_n,
    offs_m, offs_n, offs_d, offs_dv, d_mask, dv_mask,
    qk_scale, dq_unscale, win_left, win_right, cap2, inv_cap2, slope2,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, DO_DK: tl.constexpr, DO_DV: tl.constexpr,
    DQ_ATOMIC: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, VARLEN: tl.constexpr,
):
    """Add query head off_h's contribution to one key block's dk and dv: the query rows that see the
    block (_query_band), masked where some row-key pair is not visible. VARLEN: the sequence's rows start
    at q_start of the packed (1, H, total, D) views and of the statistics."""
    q_base = q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    do_base = dout_ptr + off_z.to(tl.int64) * stride_gz + off_h.to(tl.int64) * stride_gh
    if VARLEN:
        q_base += q_start.to(tl.int64) * stride_qm
        do_base += q_start.to(tl.int64) * stride_gm
    q_ptrs = _streamed(
        q_base, q_len, stride_qm, stride_qd, offs_m, offs_d, HEAD_DIM=HEAD_DIM, BLOCK=BLOCK_M,
        HEAD_DIM_PAD=HEAD_DIM_PAD, TRANSPOSED=False, TMA=TMA,
    )
    do_ptrs = _streamed(
        do_base, q_len, stride_gm, stride_gd, offs_m, offs_dv, HEAD_DIM=HEAD_DIM_V, BLOCK=BLOCK_M,
        HEAD_DIM_PAD=HEAD_DIM_V_PAD, TRANSPOSED=False, TMA=TMA,
    )
    if VARLEN:
        row_base = off_h.to(tl.int64) * seq_len_q + q_start
    else:
        row_base = (off_z * num_heads + off_h).to(tl.int64) * seq_len_q
    lse2_ptrs = lse2_ptr + row_base + offs_m
    delta_ptrs = delta_ptr + row_base + offs_m
    if DQ_ATOMIC and TMA:  # the fp32 accumulator's rows are the statistics' rows, HEAD_DIM wide
        dq_ptrs = _rows_desc(dq_acc_ptr + row_base * HEAD_DIM, q_len, HEAD_DIM, HEAD_DIM=HEAD_DIM, BLOCK=BLOCK_M,
                             HEAD_DIM_PAD=HEAD_DIM_PAD)
    elif DQ_ATOMIC:
        dq_ptrs = dq_acc_ptr + (row_base + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    else:
        dq_ptrs = lse2_ptrs  # unused

    lo, mid, full_end, hi = _query_band(
        start_n, q_len, kv_len, causal_offset, win_left, win_right, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL,
        WINDOW=WINDOW,
    )
    # the three loops differ in their query range and masking only
    args = (k, v, q_ptrs, do_ptrs, lse2_ptrs, delta_ptrs, dq_ptrs, stride_qm, stride_gm, offs_m, offs_n, d_mask,
            dv_mask)
    scalars = (q_len, kv_len, causal_offset, qk_scale, dq_unscale, win_left, win_right, cap2, inv_cap2, slope2)
    if CAUSAL or WINDOW or not EVEN_N:  # else lo = mid = 0: nothing to mask before the unmasked loop
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, *args, lo, tl.minimum(mid, hi), *scalars, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, MASKED=True,
            CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST, DO_DK=DO_DK,
            DO_DV=DO_DV, DQ_ATOMIC=DQ_ATOMIC, TMA=TMA, WS=False, ROWOFF=ROWOFF, ROW32=ROW32, WINDOW=WINDOW,
            SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
    dk, dv = _attn_bwd_dkdv_inner(
        dk, dv, *args, mid, full_end, *scalars, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, MASKED=False, CAUSAL=CAUSAL,
        EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST, DO_DK=DO_DK, DO_DV=DO_DV,
        DQ_ATOMIC=DQ_ATOMIC, TMA=TMA, WS=WS, ROWOFF=ROWOFF, ROW32=ROW32, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
    )
    if WINDOW or not EVEN_M:  # else full_end = hi = q_len: no tail
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, *args, tl.maximum(mid, full_end), hi, *scalars, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, MASKED=True,
            CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST, DO_DK=DO_DK,
            DO_DV=DO_DV, DQ_ATOMIC=DQ_ATOMIC, TMA=TMA, WS=False, ROWOFF=ROWOFF, ROW32=ROW32, WINDOW=WINDOW,
            SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
    return dk, dv


@triton.jit(do_not_specialize=["head_group"])  # a launch shape: no kernel variant per value
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, dout_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr, dq_acc_ptr, seq_lens_ptr, cu_k_ptr,
    alibi_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_gz, stride_gh, stride_gm, stride_gd,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    stride_az,
    num_heads, seq_len_q, seq_len_k,
    qk_scale, scale, head_group, kv_group, head_split,
    win_left, win_right, cap2,
    # semantics: what is computed
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, GQA: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, VARLEN: tl.constexpr, DO_DK: tl.constexpr, DO_DV: tl.constexpr,
    DQ_ATOMIC: tl.constexpr,
    # numerics of the dtype
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    # tiles: how (the tuned config and layout facts of the call)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr,
):
    """dk and dv of one key block of one kv head (DO_DK and DO_DV), or one of them: a split backward
    launches this kernel twice so that each pass holds one (BLOCK_N, HEAD_DIM) fp32 accumulator, not two.
    GQA: the grid's heads are kv heads, and the program sums the kv_group query heads that read this one
    in a fixed order (no atomics, so the group reduction is deterministic); num_heads counts query heads.
    head_split > 1 (GQA on a grid too small to fill the GPU): the grid's heads are kv head x part, each
    program sums kv_group / head_split of the group's query heads and writes its fp32 partial sums at its
    grid head (dk_ptr, dv_ptr: (Z, H_kv * head_split, N_k, D) scratch) for _attn_bwd_group_sum_kernel.
    TMA: the streamed q and dout tiles come through tensor descriptors. WS: the unmasked query loop is
    warp-specialized. EVEN_M / EVEN_N: as in the forward; full query blocks leave no masked tail loop,
    full key blocks of a non-causal kernel no masked first loop. WINDOW, SOFTCAP, ALIBI: semantics.py.
    VARLEN: packed sequences as in the forward; a program writes only its own sequence's keys.
    DQ_ATOMIC (with DO_DK): the one-pass backward; the program also adds its key block's share of dq, unscaled,
    to dq_acc_ptr (fp32, contiguous (Z, H, N_q, HEAD_DIM), zeroed by the preprocess) with atomic adds."""
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    EVEN_DV: tl.constexpr = HEAD_DIM_V == HEAD_DIM_V_PAD
    pid_n, off_hs, off_z = _tile(head_group, DEAL=CAUSAL, REVERSE=False)  # causal: the first key blocks see the most queries
    if GQA:
        off_hk = off_hs // head_split
        per_part = kv_group // head_split
        g_lo = (off_hs % head_split) * per_part
    else:
        off_hk = off_hs
    q_start, k_start, q_len, kv_len, causal_offset = _sequence(
        seq_lens_ptr, cu_k_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS=HAS_SEQ_LENS, VARLEN=VARLEN,
    )
    start_n = pid_n * BLOCK_N
    if VARLEN:
        if start_n >= kv_len:  # the grid covers the longest sequence
            return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    dv_mask = offs_dv < HEAD_DIM_V
    if EVEN_N:
        kd_mask = None if EVEN_D else d_mask[None, :]
        vd_mask = None if EVEN_DV else dv_mask[None, :]
    else:
        kd_mask = (offs_n < kv_len)[:, None] & d_mask[None, :]
        vd_mask = (offs_n < kv_len)[:, None] & dv_mask[None, :]

    k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    if VARLEN:
        k_base += k_start.to(tl.int64) * stride_kn
        v_base += k_start.to(tl.int64) * stride_vn
    k = _load(
        k_base + _rows(offs_n, ROW32=ROW32)[:, None] * stride_kn + offs_d[None, :] * stride_kd, kd_mask, UPCAST=UPCAST,
    )
    if DO_DK:  # dv alone never reads v
        v = _load(
            v_base + _rows(offs_n, ROW32=ROW32)[:, None] * stride_vn + offs_dv[None, :] * stride_vd, vd_mask, UPCAST=UPCAST,
        )
    else:
        v = k
    dq_unscale = _unprescale(qk_scale, DTYPE=k.dtype)  # (the one-pass backward's dq reads k too)
    k, qk_scale = _prescaled(k, qk_scale)  # k enters the score dots (dk reads q and ds)
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)

    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V_PAD], dtype=tl.float32)
    # two call sites on purpose: without GQA the kernel has no head loop at all, so a dense backward
    # compiles to the straight-line kernel it was before the variants (the dense cells did not move)
    if GQA:
        for g in range(g_lo, g_lo + per_part):
            off_h = off_hk * kv_group + g
            slope2 = _slope(alibi_ptr, off_z, stride_az, off_h, ALIBI=ALIBI)
            dk, dv = _attn_bwd_dkdv_head(
                dk, dv, k, v, q_ptr, dout_ptr, lse2_ptr, delta_ptr, dq_acc_ptr, stride_qz, stride_qh, stride_qm,
                stride_qd, stride_gz, stride_gh, stride_gm, stride_gd, off_z, off_h, num_heads, seq_len_q, q_start, q_len,
                kv_len, causal_offset, start_n, offs_m, offs_n, offs_d, offs_dv, d_mask, dv_mask, qk_scale, dq_unscale,
                win_left, win_right, cap2, inv_cap2, slope2, HEAD_DIM=HEAD_DIM, HEAD_DIM_PAD=HEAD_DIM_PAD,
                HEAD_DIM_V=HEAD_DIM_V, HEAD_DIM_V_PAD=HEAD_DIM_V_PAD, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL,
                EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, EVEN_M=EVEN_M, EVEN_N=EVEN_N, DOT_PRECISION=DOT_PRECISION,
                UPCAST=UPCAST, DO_DK=DO_DK, DO_DV=DO_DV, DQ_ATOMIC=DQ_ATOMIC, TMA=TMA, WS=WS, ROWOFF=ROWOFF,
                ROW32=ROW32, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI, VARLEN=VARLEN,
            )
    else:
        slope2 = _slope(alibi_ptr, off_z, stride_az, off_hk, ALIBI=ALIBI)
        dk, dv = _attn_bwd_dkdv_head(
            dk, dv, k, v, q_ptr, dout_ptr, lse2_ptr, delta_ptr, dq_acc_ptr, stride_qz, stride_qh, stride_qm, stride_qd,
            stride_gz, stride_gh, stride_gm, stride_gd, off_z, off_hk, num_heads, seq_len_q, q_start, q_len, kv_len,
            causal_offset, start_n, offs_m, offs_n, offs_d, offs_dv, d_mask, dv_mask, qk_scale, dq_unscale, win_left,
            win_right, cap2, inv_cap2, slope2, HEAD_DIM=HEAD_DIM, HEAD_DIM_PAD=HEAD_DIM_PAD, HEAD_DIM_V=HEAD_DIM_V,
            HEAD_DIM_V_PAD=HEAD_DIM_V_PAD, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, EVEN_D=EVEN_D,
            EVEN_DV=EVEN_DV, EVEN_M=EVEN_M, EVEN_N=EVEN_N, DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST, DO_DK=DO_DK,
            DO_DV=DO_DV, DQ_ATOMIC=DQ_ATOMIC, TMA=TMA, WS=WS, ROWOFF=ROWOFF, ROW32=ROW32, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
            ALIBI=ALIBI, VARLEN=VARLEN,
        )

    if VARLEN:  # only this sequence's keys: the next ones belong to the next sequence
        key_in = (offs_n < kv_len)[:, None]
        dk_ptr += k_start.to(tl.int64) * stride_dkn
        dv_ptr += k_start.to(tl.int64) * stride_dvn
    else:
        key_in = (offs_n < seq_len_k)[:, None]
    if DO_DK:
        dk *= scale  # s = scale * q.k, so ds/dk carries the natural scale
        dk_ptrs = (dk_ptr + off_z.to(tl.int64) * stride_dkz + off_hs.to(tl.int64) * stride_dkh
                   + _rows(offs_n, ROW32=ROW32)[:, None] * stride_dkn + offs_d[None, :] * stride_dkd)
        if EVEN_N:
            tl.store(dk_ptrs, dk.to(dk_ptr.dtype.element_ty), mask=kd_mask)
        else:
            tl.store(dk_ptrs, dk.to(dk_ptr.dtype.element_ty), mask=key_in & d_mask[None, :])
    if DO_DV:
        dv_ptrs = (dv_ptr + off_z.to(tl.int64) * stride_dvz + off_hs.to(tl.int64) * stride_dvh
                   + _rows(offs_n, ROW32=ROW32)[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd)
        if EVEN_N:
            tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=vd_mask)
        else:
            tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=key_in & dv_mask[None, :])


@triton.jit
def _attn_bwd_dq_inner(
    dq, q, do, lse2, delta,
    k_ptrs, v_ptrs, step_k, step_v,
    offs_m, offs_n, d_mask, dv_mask,
    lo, hi, kv_len, causal_offset, qk_scale,
    win_left, win_right, cap2, inv_cap2, slope2,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
    ROWOFF: tl.constexpr, ROW32: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
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
        k_at, v_at = _stepped(k_ptrs, v_ptrs, start_n, step_k, step_v, ROWOFF=ROWOFF, ROW32=ROW32)
        if TMA:
            k_t = _desc_load(k_ptrs, start_n, UPCAST=UPCAST).T  # (D, BLOCK_N)
            v_t = _desc_load(v_ptrs, start_n, UPCAST=UPCAST).T
        elif MASKED:
            k_t = _load(k_at, kv_mask[None, :] & d_mask[:, None], UPCAST=UPCAST)  # (D, BLOCK_N)
            v_t = _load(v_at, kv_mask[None, :] & dv_mask[:, None], UPCAST=UPCAST)
        else:
            k_t = _load(k_at, None if EVEN_D else d_mask[:, None], UPCAST=UPCAST)
            v_t = _load(v_at, None if EVEN_DV else dv_mask[:, None], UPCAST=UPCAST)
        s, t = _scores(
            tl.dot(q, k_t, input_precision=DOT_PRECISION), offs_m[:, None], cols[None, :], causal_offset, qk_scale,
            cap2, inv_cap2, slope2, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
        p = _probs(s, lse2[:, None])
        if MASKED:
            visible = _visible(
                offs_m[:, None], cols[None, :], kv_len, causal_offset, win_left, win_right, KEY_MASK=True,
                CAUSAL=CAUSAL, WINDOW=WINDOW,
            )
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, v_t, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=DOT_PRECISION)
        if not TMA and not ROWOFF:
            k_ptrs += BLOCK_N * step_k
            v_ptrs += BLOCK_N * step_v
    return dq


@triton.jit(do_not_specialize=["head_group"])  # a launch shape: no kernel variant per value
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, dout_ptr, lse2_ptr, delta_ptr, dq_ptr, seq_lens_ptr, cu_k_ptr, alibi_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_gz, stride_gh, stride_gm, stride_gd,
    stride_dqz, stride_dqh, stride_dqm, stride_dqd,
    stride_az,
    num_heads, seq_len_q, seq_len_k,
    qk_scale, scale, head_group, kv_group,
    win_left, win_right, cap2,
    # semantics: what is computed
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, VARLEN: tl.constexpr,
    # numerics of the dtype
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    # tiles: how (the tuned config and layout facts of the call)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr,
):
    """dq of one query block. TMA: the streamed k and v tiles come through tensor descriptors.
    WS: the unmasked key loop is warp-specialized. EVEN_M / EVEN_N: as in the forward. The variants as
    in the forward: kv head h // kv_group, HEAD_DIM_V, WINDOW, SOFTCAP, ALIBI, VARLEN (semantics.py)."""
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    EVEN_DV: tl.constexpr = HEAD_DIM_V == HEAD_DIM_V_PAD
    pid_m, off_h, off_z = _tile(head_group, DEAL=CAUSAL, REVERSE=CAUSAL)
    off_hk = off_h // kv_group
    q_start, k_start, q_len, kv_len, causal_offset = _sequence(
        seq_lens_ptr, cu_k_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS=HAS_SEQ_LENS, VARLEN=VARLEN,
    )
    start_m = pid_m * BLOCK_M
    if VARLEN:
        if start_m >= q_len:  # the grid covers the longest sequence
            return
        q_ptr += q_start.to(tl.int64) * stride_qm
        dout_ptr += q_start.to(tl.int64) * stride_gm
        dq_ptr += q_start.to(tl.int64) * stride_dqm
        k_ptr += k_start.to(tl.int64) * stride_kn
        v_ptr += k_start.to(tl.int64) * stride_vn
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    dv_mask = offs_dv < HEAD_DIM_V
    if EVEN_M:
        row_mask = None
        qd_mask = None if EVEN_D else d_mask[None, :]
        gd_mask = None if EVEN_DV else dv_mask[None, :]
    else:
        row_mask = offs_m < q_len
        qd_mask = row_mask[:, None] & d_mask[None, :]
        gd_mask = row_mask[:, None] & dv_mask[None, :]

    q = _load(
        q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
              + _rows(offs_m, ROW32=ROW32)[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        qd_mask, UPCAST=UPCAST,
    )
    do = _load(
        dout_ptr + off_z.to(tl.int64) * stride_gz + off_h.to(tl.int64) * stride_gh
               + _rows(offs_m, ROW32=ROW32)[:, None] * stride_gm + offs_dv[None, :] * stride_gd,
        gd_mask, UPCAST=UPCAST,
    )
    if VARLEN:
        row_base = off_h.to(tl.int64) * seq_len_q + q_start
    else:
        row_base = (off_z * num_heads + off_h).to(tl.int64) * seq_len_q
    if EVEN_M:
        lse2 = tl.load(lse2_ptr + row_base + offs_m)
        delta = tl.load(delta_ptr + row_base + offs_m)
    else:
        lse2 = tl.load(lse2_ptr + row_base + offs_m, mask=row_mask, other=float("inf"))
        delta = tl.load(delta_ptr + row_base + offs_m, mask=row_mask, other=0.0)

    k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    k_ptrs = _streamed(
        k_base, kv_len, stride_kn, stride_kd, offs_n, offs_d, HEAD_DIM=HEAD_DIM, BLOCK=BLOCK_N,
        HEAD_DIM_PAD=HEAD_DIM_PAD, TRANSPOSED=True, TMA=TMA,
    )
    v_ptrs = _streamed(
        v_base, kv_len, stride_vn, stride_vd, offs_n, offs_dv, HEAD_DIM=HEAD_DIM_V, BLOCK=BLOCK_N,
        HEAD_DIM_PAD=HEAD_DIM_V_PAD, TRANSPOSED=True, TMA=TMA,
    )
    q, qk_scale = _prescaled(q, qk_scale)  # q enters only the score dots here (dq reads ds and k)
    slope2 = _slope(alibi_ptr, off_z, stride_az, off_h, ALIBI=ALIBI)
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)

    lo, full_lo, full_hi, hi = _band(
        start_m, q_len, kv_len, causal_offset, win_left, win_right, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL,
        HAS_SEQ_LENS=HAS_SEQ_LENS, EVEN_N=EVEN_N, WINDOW=WINDOW,
    )
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    if WINDOW:  # the window's left edge
        dq = _attn_bwd_dq_inner(
            dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, d_mask, dv_mask, lo,
            full_lo, kv_len, causal_offset, qk_scale, win_left, win_right, cap2, inv_cap2, slope2, BLOCK_N=BLOCK_N,
            MASKED=True, CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST,
            TMA=TMA, WS=False, ROWOFF=ROWOFF, ROW32=ROW32, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, d_mask, dv_mask, full_lo,
        full_hi, kv_len, causal_offset, qk_scale, win_left, win_right, cap2, inv_cap2, slope2, BLOCK_N=BLOCK_N,
        MASKED=False, CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST,
        TMA=TMA, WS=WS, ROWOFF=ROWOFF, ROW32=ROW32, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
    )
    if CAUSAL or WINDOW or not EVEN_N:  # else full_hi = hi = N_k: no masked key block
        dq = _attn_bwd_dq_inner(
            dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, d_mask, dv_mask, full_hi,
            hi, kv_len, causal_offset, qk_scale, win_left, win_right, cap2, inv_cap2, slope2, BLOCK_N=BLOCK_N,
            MASKED=True, CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST,
            TMA=TMA, WS=False, ROWOFF=ROWOFF, ROW32=ROW32, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
    dq *= scale

    dq_ptrs = (dq_ptr + off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh
               + _rows(offs_m, ROW32=ROW32)[:, None] * stride_dqm + offs_d[None, :] * stride_dqd)
    if EVEN_M:
        tl.store(dq_ptrs, dq.to(dq_ptr.dtype.element_ty), mask=qd_mask)
    else:
        if VARLEN:  # only this sequence's rows: the next ones belong to the next sequence
            row_in = offs_m < q_len
        else:
            row_in = offs_m < seq_len_q
        tl.store(dq_ptrs, dq.to(dq_ptr.dtype.element_ty), mask=row_in[:, None] & d_mask[None, :])
