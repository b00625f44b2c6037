"""The forward kernel: online softmax over key blocks, one program per (query block, head, batch); its second
pass (PASS 2) one per chunk of rows, which computes only their marked blocks (_attn_fwd_kernel)."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)

from .lazy import _rescale  # noqa: E402
from .semantics import (_band, _inv, _normalize, _online_softmax, _prescaled, _scores, _sequence, _sink_lse,  # noqa: E402
                        _sink_start, _slope, _visible)
from .tile_order import _tile  # noqa: E402
from .tiles import _desc_load, _desc_load4, _load, _rows, _rows_desc, _stepped, _streamed  # noqa: E402


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    k_ptrs, v_ptrs, step_k, step_v,
    offs_m, offs_n, d_mask, dv_mask,
    lo, hi, kv_len, causal_offset, qk_scale, off_z, off_h,
    win_left, win_right, cap2, inv_cap2, slope2,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
    WS: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr, HOST_DESC: tl.constexpr, LAZY: tl.constexpr,
    VOTE_ROWS: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi). MASKED blocks apply the causal mask, and the key-length
    mask unless EVEN_N (every key block full, so every key below hi <= kv_len is in range); unmasked
    blocks are fully in range and fully visible to every row of this query block.
    TMA: k_ptrs and v_ptrs are tensor descriptors (_rows_desc) instead of pointer tiles; HOST_DESC: built
    on the host over the whole tensors, read at slice (off_z, off_h) (_desc_load4).
    WS: Triton's automatic warp specialization of the loop (loads, dots and softmax in separate warps).
    ROWOFF: each pointer tile is the first tile plus a row offset (_stepped), instead of pointer tiles
    advanced block by block (AttnConfig.rowoff: the same loads, which ptxas schedules differently).
    off_h is the kv head. WINDOW, SOFTCAP, ALIBI: the variants of semantics.py (_scores, _visible)."""
    KEY_MASK: tl.constexpr = MASKED and not EVEN_N
    if not TMA and not ROWOFF:
        k_ptrs += tl.cast(lo, tl.int64) * step_k
        v_ptrs += tl.cast(lo, tl.int64) * step_v
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        if KEY_MASK:
            kv_mask = cols < kv_len
        k_at, v_at = _stepped(k_ptrs, v_ptrs, start_n, step_k, step_v, ROWOFF=ROWOFF, ROW32=ROW32)
        if HOST_DESC:
            k = _desc_load4(k_ptrs, off_z, off_h, start_n, UPCAST=UPCAST).T  # (D, BLOCK_N)
        elif TMA:
            k = _desc_load(k_ptrs, start_n, UPCAST=UPCAST).T
        elif KEY_MASK:
            k = _load(k_at, kv_mask[None, :] & d_mask[:, None], UPCAST=UPCAST)  # (D, BLOCK_N)
        elif EVEN_D:
            k = _load(k_at, None, UPCAST=UPCAST)
        else:
            k = _load(k_at, d_mask[:, None], UPCAST=UPCAST)
        # -- scores, base 2, exact (semantics._mul_exact: the top score of a row gets exp2(0) = 1) --
        s, _ = _scores(
            tl.dot(q, k, input_precision=DOT_PRECISION), offs_m[:, None], cols[None, :], causal_offset, qk_scale,
            cap2, inv_cap2, slope2, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
        if MASKED:
            visible = _visible(
                offs_m[:, None], cols[None, :], kv_len, causal_offset, win_left, win_right, KEY_MASK=KEY_MASK,
                CAUSAL=CAUSAL, WINDOW=WINDOW,
            )
            s = tl.where(visible, s, float("-inf"))
        p, alpha, grew, m_new, l_i = _online_softmax(s, m_i, l_i, MASKED=MASKED, LAZY=LAZY)
        # -- accumulate p @ v --
        if HOST_DESC:
            v = _desc_load4(v_ptrs, off_z, off_h, start_n, UPCAST=UPCAST)
        elif TMA:
            v = _desc_load(v_ptrs, start_n, UPCAST=UPCAST)
        elif KEY_MASK:
            v = _load(v_at, kv_mask[:, None] & dv_mask[None, :], UPCAST=UPCAST)
        elif EVEN_DV:
            v = _load(v_at, None, UPCAST=UPCAST)
        else:
            v = _load(v_at, dv_mask[None, :], UPCAST=UPCAST)
        acc = _rescale(acc, alpha, grew, VOTE_ROWS=VOTE_ROWS)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        if not TMA and not ROWOFF:
            k_ptrs += BLOCK_N * step_k
            v_ptrs += BLOCK_N * step_v
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_tile(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, alibi_ptr, sinks_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_oz, stride_oh, stride_om, stride_od,
    stride_lz, stride_lh, stride_az,
    seq_len_q, qk_scale, kv_group, win_left, win_right, cap2,
    pid_m, off_h, off_z, q_start, k_start, q_len, kv_len, causal_offset,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, VARLEN: tl.constexpr, PASS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr, HOST_DESC: tl.constexpr, LAZY: tl.constexpr,
    VOTE_ROWS: tl.constexpr,
):
    """Query block pid_m of head off_h of batch slice off_z (its sequence's rows: q_start, k_start, q_len,
    kv_len, causal_offset, semantics._sequence): q loaded, its band of key blocks, out and lse stored.
    _attn_fwd_kernel's arguments otherwise."""
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    EVEN_DV: tl.constexpr = HEAD_DIM_V == HEAD_DIM_V_PAD
    off_hk = off_h // kv_group
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    dv_mask = offs_dv < HEAD_DIM_V

    if HOST_DESC:
        q = _desc_load4(q_ptr, off_z, off_h, start_m, UPCAST=UPCAST)
        k_ptrs = k_ptr
        v_ptrs = v_ptr
    else:
        # 64-bit base offsets: z * stride_z alone can pass 2^31 elements
        q_base = q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
        k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
        v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
        if VARLEN:
            q_base += q_start.to(tl.int64) * stride_qm
            k_base += k_start.to(tl.int64) * stride_kn
            v_base += k_start.to(tl.int64) * stride_vn
        if TMA:
            q = _desc_load(
                _rows_desc(q_base, q_len, stride_qm, HEAD_DIM=HEAD_DIM, BLOCK=BLOCK_M, HEAD_DIM_PAD=HEAD_DIM_PAD), start_m, UPCAST=UPCAST,
            )
        else:
            q_ptrs = q_base + _rows(offs_m, ROW32=ROW32)[:, None] * stride_qm + offs_d[None, :] * stride_qd
            if EVEN_M:
                q = _load(q_ptrs, None if EVEN_D else d_mask[None, :], UPCAST=UPCAST)
            else:
                q = _load(q_ptrs, (offs_m < q_len)[:, None] & d_mask[None, :], UPCAST=UPCAST)
        # k is read as k^T tiles (D, BLOCK_N) by pointers; a descriptor's (BLOCK_N, D) tile is transposed in the loop
        k_ptrs = _streamed(
            k_base, kv_len, stride_kn, stride_kd, offs_n, offs_d, HEAD_DIM=HEAD_DIM, BLOCK=BLOCK_N,
            HEAD_DIM_PAD=HEAD_DIM_PAD, TRANSPOSED=True, TMA=TMA,
        )
        v_ptrs = _streamed(
            v_base, kv_len, stride_vn, stride_vd, offs_n, offs_dv, HEAD_DIM=HEAD_DIM_V, BLOCK=BLOCK_N,
            HEAD_DIM_PAD=HEAD_DIM_V_PAD, TRANSPOSED=False, TMA=TMA,
        )
    if PASS >= 2:  # exact (the same bits where the raw dot is finite), and the dot overflows only where the score does
        q, qk_scale = _prescaled(q, qk_scale)
    if SINKS:  # the sink is a logit of its own: the row starts with max = sink, sum = exp(sink - sink) = 1
        sink = tl.load(sinks_ptr + off_h).to(tl.float32)
        m_i, l_i = _sink_start(sink, BLOCK_M=BLOCK_M)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], dtype=tl.float32)
    slope2 = _slope(alibi_ptr, off_z, stride_az, off_h, ALIBI=ALIBI)
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)

    lo, full_lo, full_hi, hi = _band(
        start_m, q_len, kv_len, causal_offset, win_left, win_right, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL,
        HAS_SEQ_LENS=HAS_SEQ_LENS, EVEN_N=EVEN_N, WINDOW=WINDOW,
    )
    if WINDOW:  # the window's left edge
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, d_mask, dv_mask, lo, full_lo,
            kv_len, causal_offset, qk_scale, off_z, off_hk, win_left, win_right, cap2, inv_cap2, slope2,
            BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, EVEN_N=EVEN_N,
            DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST, TMA=TMA, WS=False, ROWOFF=ROWOFF, ROW32=ROW32,
            HOST_DESC=HOST_DESC, LAZY=False, VOTE_ROWS=0, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, d_mask, dv_mask, full_lo, full_hi,
        kv_len, causal_offset, qk_scale, off_z, off_hk, win_left, win_right, cap2, inv_cap2, slope2, BLOCK_N=BLOCK_N,
        MASKED=False, CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, EVEN_N=EVEN_N, DOT_PRECISION=DOT_PRECISION,
        UPCAST=UPCAST, TMA=TMA, WS=WS, ROWOFF=ROWOFF, ROW32=ROW32, HOST_DESC=HOST_DESC, LAZY=LAZY,
        VOTE_ROWS=VOTE_ROWS, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
    )
    if CAUSAL or WINDOW or not EVEN_N:  # else full_hi = hi = N_k: no masked key block
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, d_mask, dv_mask, full_hi, hi,
            kv_len, causal_offset, qk_scale, off_z, off_hk, win_left, win_right, cap2, inv_cap2, slope2,
            BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, EVEN_N=EVEN_N,
            DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST, TMA=TMA, WS=False, ROWOFF=ROWOFF, ROW32=ROW32,
            HOST_DESC=HOST_DESC, LAZY=False, VOTE_ROWS=0, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )

    # -- epilogue: normalise; rows that saw no key (l == 0) or are padding give 0 and lse = -inf. A row
    # that saw no key has acc == 0 exactly (each of its p was 0), so only seq_lens' padding rows, which
    # a block computes with its valid rows, need their output zeroed. With sinks, l >= 1: a row that
    # sees no key outputs 0 and its lse is the sink --
    if HAS_SEQ_LENS:
        row_live = (l_i > 0) & (offs_m < q_len)
    else:
        row_live = l_i > 0
    out, lse = _normalize(acc, m_i, l_i, row_live)
    if HAS_SEQ_LENS:
        out = tl.where(row_live[:, None], out, 0.0)
    if SINKS:
        lse = tl.where(row_live, _sink_lse(lse, sink), lse)
    if PASS == 1:
        # a raw q.k past fp32's range leaves +-inf or NaN scores: a NaN sum, or no finite max in a
        # row that has keys (every score -inf). Mark the block for the second pass. (A block whose rows see
        # no key is marked too; its second pass has no key block to run.)
        overflow = tl.max(((l_i != l_i) | (m_i == float("-inf"))).to(tl.int32), 0)
        lse = tl.where(overflow > 0, float("nan"), lse)

    o_ptrs = (out_ptr + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
              + _rows(offs_m, ROW32=ROW32)[:, None] * stride_om + offs_dv[None, :] * stride_od)
    l_ptrs = lse_ptr + off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + offs_m
    if VARLEN:  # only this sequence's rows: the next ones belong to the next sequence
        o_ptrs += q_start.to(tl.int64) * stride_om
        l_ptrs += q_start
        row_in = offs_m < q_len
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & dv_mask[None, :])
        tl.store(l_ptrs, lse, mask=row_in)
    elif EVEN_M:
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=None if EVEN_DV else dv_mask[None, :])
        tl.store(l_ptrs, lse)
    else:
        row_in = offs_m < seq_len_q
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & dv_mask[None, :])
        tl.store(l_ptrs, lse, mask=row_in)


@triton.jit(do_not_specialize=["head_group"])  # a launch shape: no kernel variant per value
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, seq_lens_ptr, cu_k_ptr, alibi_ptr, sinks_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_oz, stride_oh, stride_om, stride_od,
    stride_lz, stride_lh, stride_az,
    num_heads, seq_len_q, seq_len_k,
    qk_scale, head_group, kv_group,
    win_left, win_right, cap2,
    # semantics: what is computed
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, VARLEN: tl.constexpr, PASS: tl.constexpr,
    # numerics of the dtype
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    # tiles: how (the tuned config and layout facts of the call)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr, ROWOFF: tl.constexpr, ROW32: tl.constexpr, HOST_DESC: tl.constexpr, LAZY: tl.constexpr,
    VOTE_ROWS: tl.constexpr, MARK_ROWS: tl.constexpr,
):
    """TMA: q, k and v are read through tensor descriptors (Hopper's copy engine) instead of pointer
    tiles; the launcher sets it only for inputs a descriptor can address (tma_ok). HOST_DESC (with TMA,
    without seq_lens): q_ptr, k_ptr and v_ptr are descriptors the launcher built over the whole tensors
    (host_descriptor) instead of pointers each program builds its slice's descriptors from. WS: the
    unmasked key loop is warp-specialized (the launcher sets it only with TMA). ROWOFF: see _attn_fwd_inner.
    ROW32: row offsets inside a (batch, head) slice are computed in 32 bits (rows_fit_int32).
    EVEN_M / EVEN_N: every query / key block is full (no seq_lens, the length a multiple of the block):
    rows need no masks, and a non-causal kernel with full key blocks has no masked key loop.
    Variants (semantics.py): q head h reads kv head h // kv_group (GQA; kv_group = 1 specializes away);
    v and out have HEAD_DIM_V columns; WINDOW (win_left, win_right: key blocks outside the band are
    skipped), SOFTCAP (cap2 = softcap * log2(e)), ALIBI (slopes at alibi_ptr + z * stride_az + h), SINKS
    (sinks_ptr[h]: one more logit in every row's denominator, carrying no value: the running max and sum
    start from it). VARLEN (with HAS_SEQ_LENS): packed sequences, seq_lens_ptr / cu_k_ptr are cu_seqlens_q / _k
    (semantics._sequence); the grid's z is the sequence, the z strides are 0, and a program writes only
    its own sequence's rows.
    PASS (overflow_passes): 0, the only pass (fp16: its raw q.k cannot leave fp32's range); 1, the first of
    two, which marks a block whose raw q.k left fp32's range with a NaN lse; 2, the second, which runs only
    the blocks with a marked row (also the Hopper forward's, semantics._fma_marked), on q times the power of
    two of the scale (semantics._prescaled); 3, the only pass of a
    small call, on the prescaled q in every block (one launch where two cost more host time than the
    prescaled dots cost the GPU). The second pass's grid is (MARK_ROWS-row chunks, heads, batch): a program
    loads the lse of its chunk's rows at once and returns where none is marked (the common case), so that the
    pass costs a wave or two of programs, not one program a query block (launch.MARKED_PASS_ROWS)."""
    if PASS == 2:  # MARK_ROWS rows a program, of which only the blocks with a marked row (a NaN lse) run again
        pid_c = tl.program_id(0)
        off_h = tl.program_id(1)
        off_z = tl.program_id(2)
        TILES: tl.constexpr = MARK_ROWS // BLOCK_M
    else:
        pid_c, off_h, off_z = _tile(head_group, DEAL=CAUSAL, REVERSE=CAUSAL)
        TILES: tl.constexpr = 1
    q_start, k_start, q_len, kv_len, causal_offset = _sequence(
        seq_lens_ptr, cu_k_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS=HAS_SEQ_LENS, VARLEN=VARLEN,
    )
    if PASS == 2:
        rows_ptr = lse_ptr + off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh
        if VARLEN:
            rows_ptr += q_start
        rows = pid_c * MARK_ROWS + tl.arange(0, MARK_ROWS)
        marked = tl.load(rows_ptr + rows, mask=rows < q_len, other=0.0)
        if tl.max((marked != marked).to(tl.int32), 0) == 0:
            return
    elif VARLEN:
        if pid_c * BLOCK_M >= q_len:  # the grid covers the longest sequence
            return
    for j in range(TILES):  # the second pass's blocks one after the other; a loop of one elsewhere (it folds away)
        pid_m = pid_c * TILES + j
        if PASS == 2:
            block = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            in_block = tl.load(rows_ptr + block, mask=block < q_len, other=0.0)
            run = tl.max((in_block != in_block).to(tl.int32), 0) > 0
        else:
            run = True
        if run:
            _attn_fwd_tile(
                q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, alibi_ptr, sinks_ptr,
                stride_qz, stride_qh, stride_qm, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                stride_vz, stride_vh, stride_vn, stride_vd, stride_oz, stride_oh, stride_om, stride_od,
                stride_lz, stride_lh, stride_az, seq_len_q, qk_scale, kv_group, win_left, win_right, cap2,
                pid_m, off_h, off_z, q_start, k_start, q_len, kv_len, causal_offset,
                HEAD_DIM=HEAD_DIM, HEAD_DIM_PAD=HEAD_DIM_PAD, HEAD_DIM_V=HEAD_DIM_V,
                HEAD_DIM_V_PAD=HEAD_DIM_V_PAD, CAUSAL=CAUSAL, WINDOW=WINDOW, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
                SINKS=SINKS, HAS_SEQ_LENS=HAS_SEQ_LENS, VARLEN=VARLEN, PASS=PASS,
                DOT_PRECISION=DOT_PRECISION, UPCAST=UPCAST, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, TMA=TMA,
                WS=WS, EVEN_M=EVEN_M, EVEN_N=EVEN_N, ROWOFF=ROWOFF, ROW32=ROW32, HOST_DESC=HOST_DESC,
                LAZY=LAZY, VOTE_ROWS=VOTE_ROWS,
            )
