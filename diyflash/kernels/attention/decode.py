"""KV-cache attention (inference): the cache append, the split-KV decode kernel and its combine.

A decode step has few query rows (N_q from 1 to a few hundred) against a long cache, so the work is
reading K and V once. The decode kernel packs the G query heads of a kv head with their N_q rows into one
tile (row r is query r // G of head h_kv * G + r % G: GQA packing, K/V loaded once per group), and splits
the keys over programs (split-KV, flash-decoding) when B * H_kv * row tiles cannot fill the GPU; each
split writes its normalised partial output and lse, and the splits are merged in a fixed order
(deterministic, _merge_rows): by the last program of a row tile to finish, counted on a self-resetting
counter (MERGE: an eager call in one launch), or by the combine kernel, rows a program (calls through the
op, CUDA graphs, paged caches, many splits), with the same bits. Scores and masks are semantics.py's
(_scores, _visible); a paged cache is read through its block table: one entry a step of keys where a page
holds whole steps (ONE_PAGE), else one a key column.
"""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)

from .semantics import (_decode_keys, _from_start, _inv, _merge_rows, _normalize, _online_softmax,  # noqa: E402
                        _prescaled, _scores, _sink_lse, _sink_start, _slope, _visible)
from .tiles import _load  # noqa: E402
from ..value_checks import kvcache_row_check  # noqa: E402


@triton.jit
def _cache_slots(b, cols, valid, block_table_ptr, stride_btb, num_pages, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 ONE_PAGE: tl.constexpr, first):
    """Where cache positions `cols` of batch b live, as (slot, row, ok), 64-bit: slot is dim 0 of the cache
    (b for a contiguous cache; for a paged one the page block_table[b, col // PAGE_SIZE], clamped into
    [0, num_pages) so that no value reads outside the cache), row is dim 2 (col, or col % PAGE_SIZE), ok
    whether the page entry was in range (always True for a contiguous cache). K and V share one lookup:
    element offsets are slot * stride_z + row * stride_n with each cache's strides (attention_torch's
    _cache_rows mirrors this). ONE_PAGE: the caller promises that every col lies in the page of `first`
    (a block of keys aligned to a size that divides PAGE_SIZE), so the page is one scalar load, not one per
    column."""
    if PAGED:
        if ONE_PAGE:  # one scalar load, splat to the columns (one return type for every branch)
            page = tl.load(block_table_ptr + b.to(tl.int64) * stride_btb + first // PAGE_SIZE) + tl.zeros_like(cols)
        else:
            page = tl.load(block_table_ptr + b.to(tl.int64) * stride_btb + cols // PAGE_SIZE, mask=valid, other=0)
        ok = (page >= 0) & (page < num_pages)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1)
        return page.to(tl.int64), (cols % PAGE_SIZE).to(tl.int64), ok
    return b.to(tl.int64) + tl.zeros_like(cols).to(tl.int64), cols.to(tl.int64), cols >= 0  # one type per branch


@triton.jit
def _cache_append_kernel(
    kn_ptr, vn_ptr, kc_ptr, vc_ptr, cache_seqlens_ptr, block_table_ptr,
    stride_knz, stride_knh, stride_knn, stride_knd,
    stride_vnz, stride_vnh, stride_vnn, stride_vnd,
    stride_kcz, stride_kch, stride_kcn, stride_kcd,
    stride_vcz, stride_vch, stride_vcn, stride_vcd,
    stride_btb, n_new, capacity, num_pages,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
):
    """Write the new keys and values of (batch, kv head) at cache positions cache_seqlens[b] + j. A
    position outside [0, capacity) or on a page entry outside [0, num_pages) is not written. Grid (B, H_kv,
    blocks of new keys): the batch on axis 0, which CUDA does not cap at 65535."""
    b = tl.program_id(0)
    off_h = tl.program_id(1)
    j = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    pos = tl.load(cache_seqlens_ptr + b) + j
    ok = (j < n_new) & (pos >= 0) & (pos < capacity)
    slot, row, page_ok = _cache_slots(
        b, pos, ok, block_table_ptr, stride_btb, num_pages, PAGED=PAGED, PAGE_SIZE=PAGE_SIZE, ONE_PAGE=False, first=0,
    )
    rows = slot * stride_kcz + row * stride_kcn
    vrows = slot * stride_vcz + row * stride_vcn
    ok = ok & page_ok
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    jj = j.to(tl.int64)
    src_k = kn_ptr + b.to(tl.int64) * stride_knz + off_h.to(tl.int64) * stride_knh + jj[:, None] * stride_knn
    src_v = vn_ptr + b.to(tl.int64) * stride_vnz + off_h.to(tl.int64) * stride_vnh + jj[:, None] * stride_vnn
    k_mask = ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    v_mask = ok[:, None] & (offs_dv < HEAD_DIM_V)[None, :]
    k = tl.load(src_k + offs_d[None, :] * stride_knd, mask=k_mask)
    v = tl.load(src_v + offs_dv[None, :] * stride_vnd, mask=v_mask)
    dst_k = kc_ptr + off_h.to(tl.int64) * stride_kch + rows[:, None] + offs_d[None, :] * stride_kcd
    dst_v = vc_ptr + off_h.to(tl.int64) * stride_vch + vrows[:, None] + offs_dv[None, :] * stride_vcd
    tl.store(dst_k, k, mask=k_mask)
    tl.store(dst_v, v, mask=v_mask)


@triton.jit
def _attn_decode_kernel(
    q_ptr, kc_ptr, vc_ptr, out_ptr, lse_ptr, cache_seqlens_ptr, block_table_ptr, alibi_ptr, sinks_ptr, leftpad_ptr,
    fin_out_ptr, fin_lse_ptr, counts_ptr,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_oz, stride_oh, stride_om, stride_os, stride_od,
    stride_lz, stride_lh, stride_lm, stride_ls,
    stride_fz, stride_fh, stride_fm, stride_fd,
    stride_flz, stride_flh, stride_flm,
    stride_btb, stride_az,
    num_kv_heads, n_q, n_new, capacity, num_pages, num_splits,
    qk_scale, kv_group, win_left, win_right, cap2,
    # semantics: what is computed
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, LENGTHS: tl.constexpr, LEFTPAD: tl.constexpr,
    # the API's value check of the lengths and pages, folded in (a kernel compiled with debug)
    CHECK: tl.constexpr,
    # numerics of the dtype
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    # tiles: how (the tuned config and layout facts of the call)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PAGE: tl.constexpr, SPLIT: tl.constexpr, MERGE: tl.constexpr,
    MERGE_ROWS: tl.constexpr, MERGE_SPLITS_PAD: tl.constexpr,
):
    """One (batch, kv head, row tile, split): rows r = i * kv_group + g of the tile are query i of head
    h_kv * kv_group + g. Batch b attends to its first kv_len = min(cache_seqlens[b] + n_new, capacity) keys
    (every key, kv_len = capacity, without LENGTHS: a dense call), bottom-right aligned (off = kv_len -
    n_q), and with LEFTPAD only to those from cache_leftpad[b] on (_from_start). The keys the tile's rows
    can see (causal and window bands) are cut into num_splits BLOCK_N-aligned ranges; this program takes
    range program_id(2). out/lse have a split axis (stride_os, stride_ls): without SPLIT (one split) they are
    the final output (the sink, SINKS, enters the running max and sum here), else fp32 partials, which with
    MERGE the tile's last program to finish merges into fin_out / fin_lse (counts_ptr: one int32 a row tile,
    zero before the launch and after it), and without it _attn_decode_combine_kernel does. CHECK (with
    LENGTHS): each batch row's first program asserts its lengths and pages (value_checks.kvcache_row_check),
    where an eager validate=True call would launch the check kernel."""
    bh = tl.program_id(0)
    b = bh // num_kv_heads
    off_hk = bh % num_kv_heads
    start_r = tl.program_id(1) * BLOCK_M
    split = tl.program_id(2)
    if LENGTHS:
        kv_len = tl.minimum(tl.maximum(tl.load(cache_seqlens_ptr + b) + n_new, 0), capacity)
    else:
        kv_len = capacity
    causal_offset = kv_len - n_q
    if CHECK:
        if (off_hk == 0) & (tl.program_id(1) == 0) & (split == 0):
            kvcache_row_check(cache_seqlens_ptr, leftpad_ptr, block_table_ptr, b.to(tl.int64), 1, 1, stride_btb, 1,
                              n_new, capacity, PAGE_SIZE, capacity // PAGE_SIZE, num_pages, HAS_PAD=LEFTPAD,
                              PAGED=PAGED, BLOCK=64)

    rows = start_r + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q * kv_group
    qi = rows // kv_group  # query position
    off_h = off_hk * kv_group + rows % kv_group  # query head of each row
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    d_mask = offs_d < HEAD_DIM
    dv_mask = offs_dv < HEAD_DIM_V
    q_ptrs = (q_ptr + b.to(tl.int64) * stride_qz + off_h.to(tl.int64)[:, None] * stride_qh
              + qi.to(tl.int64)[:, None] * stride_qm + offs_d[None, :] * stride_qd)
    q = _load(q_ptrs, row_ok[:, None] & d_mask[None, :], UPCAST=UPCAST)

    # -- the keys any row of this tile sees, cut into num_splits block-aligned ranges --
    if LEFTPAD:
        kv_start = tl.load(leftpad_ptr + b)
    else:
        kv_start = 0
    my_lo, my_hi = _decode_keys(
        start_r // kv_group, tl.minimum((start_r + BLOCK_M - 1) // kv_group, n_q - 1), kv_len, kv_start, causal_offset,
        win_left, win_right, split, num_splits, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, WINDOW=WINDOW, LEFTPAD=LEFTPAD,
    )

    slope2 = _slope(alibi_ptr, b, stride_az, off_h, ALIBI=ALIBI)  # off_h < H on every row: no mask needed
    if ALIBI:
        slope2 = slope2[:, None]  # a slope per row (the rows are a kv group's query heads)
    q, qk_scale = _prescaled(q, qk_scale)  # the raw dot overflows only where the scaled score does
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)
    if SINKS and not SPLIT:  # (a split's partial leaves the sink to the merge: _merge_rows)
        sink = tl.load(sinks_ptr + off_h, mask=row_ok, other=0.0).to(tl.float32)
        m_i, l_i = _sink_start(sink, BLOCK_M=BLOCK_M)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], dtype=tl.float32)
    k_head = kc_ptr + off_hk.to(tl.int64) * stride_kh
    v_head = vc_ptr + off_hk.to(tl.int64) * stride_vh
    for start_n in range(my_lo, my_hi, BLOCK_N):
        cols = start_n + offs_n
        key_ok = cols < my_hi
        slot, row, _ = _cache_slots(
            b, cols, key_ok, block_table_ptr, stride_btb, num_pages, PAGED=PAGED, PAGE_SIZE=PAGE_SIZE,
            ONE_PAGE=ONE_PAGE, first=start_n,
        )
        k_rows = slot * stride_kz + row * stride_kn
        v_rows = slot * stride_vz + row * stride_vn
        k = _load(
            k_head + k_rows[None, :] + offs_d[:, None] * stride_kd, key_ok[None, :] & d_mask[:, None], UPCAST=UPCAST,
        )
        s, _ = _scores(
            tl.dot(q, k, input_precision=DOT_PRECISION), qi[:, None], cols[None, :], causal_offset, qk_scale, cap2,
            inv_cap2, slope2, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
        )
        visible = _visible(
            qi[:, None], cols[None, :], my_hi, causal_offset, win_left, win_right, KEY_MASK=True, CAUSAL=CAUSAL,
            WINDOW=WINDOW,
        )
        visible = _from_start(visible, cols[None, :], kv_start, LEFTPAD=LEFTPAD)
        s = tl.where(visible, s, float("-inf"))
        p, alpha, _, m_new, l_i = _online_softmax(s, m_i, l_i, MASKED=True, LAZY=False)
        v = _load(
            v_head + v_rows[:, None] + offs_dv[None, :] * stride_vd, key_ok[:, None] & dv_mask[None, :],
            UPCAST=UPCAST,
        )
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    out, lse = _normalize(acc, m_i, l_i, l_i > 0)
    if SINKS and not SPLIT:
        lse = _sink_lse(lse, sink)
    row_o = b.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh + qi.to(tl.int64) * stride_om
    row_l = b.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + qi.to(tl.int64) * stride_lm
    o_ptrs = out_ptr + row_o[:, None] + split.to(tl.int64) * stride_os + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_mask[None, :])
    tl.store(lse_ptr + row_l + split.to(tl.int64) * stride_ls, lse, mask=row_ok)
    if MERGE:
        tl.debug_barrier()  # every thread's partial stored before the count says so (release, gpu scope)
        tile = counts_ptr + bh * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == num_splits - 1:  # the tile's last split
            tl.store(tile, 0)  # zero again for the next launch
            for r0 in range(start_r, tl.minimum(start_r + BLOCK_M, n_q * kv_group), MERGE_ROWS):
                r = r0 + tl.arange(0, MERGE_ROWS)
                ok = (r < start_r + BLOCK_M) & (r < n_q * kv_group)
                mi, mh = r // kv_group, off_hk * kv_group + r % kv_group
                if SINKS:
                    m_sink = tl.load(sinks_ptr + mh, mask=ok, other=0.0).to(tl.float32)
                else:
                    m_sink = 0.0
                m_out, m_lse = _merge_rows(
                    out_ptr + b.to(tl.int64) * stride_oz + mh.to(tl.int64) * stride_oh + mi.to(tl.int64) * stride_om,
                    lse_ptr + b.to(tl.int64) * stride_lz + mh.to(tl.int64) * stride_lh + mi.to(tl.int64) * stride_lm,
                    ok, m_sink, num_splits, stride_os, stride_ls, offs_dv, dv_mask, SINKS=SINKS,
                    SPLITS_PAD=MERGE_SPLITS_PAD, MARKS=False,
                )
                tl.store(fin_out_ptr + b.to(tl.int64) * stride_fz + mh.to(tl.int64)[:, None] * stride_fh
                         + mi.to(tl.int64)[:, None] * stride_fm + offs_dv[None, :] * stride_fd,
                         m_out.to(fin_out_ptr.dtype.element_ty), mask=ok[:, None] & dv_mask[None, :])
                tl.store(fin_lse_ptr + b.to(tl.int64) * stride_flz + mh.to(tl.int64) * stride_flh
                         + mi.to(tl.int64) * stride_flm, m_lse, mask=ok)


@triton.jit
def _attn_decode_combine_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, sinks_ptr,
    stride_oz, stride_oh, stride_om, stride_od,
    stride_lz, stride_lh, stride_lm,
    num_heads, n_q, num_splits, n_rows,
    HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr, SINKS: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Merge the splits of ROWS query rows of the n_rows = B x H x N_q (in that order; _merge_rows). The
    partials are contiguous (B, H, N_q, S, D_v) and (B, H, N_q, S) fp32. Grid (cdiv(n_rows, ROWS),)."""
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = r < n_rows
    i = r % n_q
    off_h = (r // n_q) % num_heads
    b = r // n_q // num_heads
    if SINKS:
        sink = tl.load(sinks_ptr + off_h, mask=row_ok, other=0.0).to(tl.float32)
    else:
        sink = 0.0
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    dv_mask = offs_dv < HEAD_DIM_V
    out, lse = _merge_rows(part_out_ptr + r * num_splits * HEAD_DIM_V, part_lse_ptr + r * num_splits, row_ok, sink,
                           num_splits, HEAD_DIM_V, 1, offs_dv, dv_mask, SINKS=SINKS, SPLITS_PAD=SPLITS_PAD,
                           MARKS=False)
    tl.store(out_ptr + (b * stride_oz + off_h * stride_oh + i * stride_om)[:, None] + offs_dv[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_mask[None, :])
    tl.store(lse_ptr + b * stride_lz + off_h * stride_lh + i * stride_lm, lse, mask=row_ok)
