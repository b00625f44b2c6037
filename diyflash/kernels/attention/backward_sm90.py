"""The Hopper (sm_90) backward: one pass in Gluon, dq through fp32 atomics (FlashAttention-2/3's design).

A program owns one key block (BLOCK_N keys of one kv head): its k and v stay in shared memory, dk and dv in
registers (two warpgroups, BLOCK_N / 2 keys each), while the query blocks that see it stream through TMA in
two slots (the next block's copy runs under this block's matmuls). Per query block, transposed as the
portable dk/dv kernel works (keys x queries), five wgmma: s^T = k q^T and dp^T = v dout^T (asynchronous, the
probabilities computed while dp^T runs), dv += p^T dout, dk += ds^T q, and dq = ds k from ds^T written to
shared memory; each program adds its dq share into an fp32 (Z, H, N_q, D) accumulator (relaxed atomics, so
dq is not bitwise reproducible; the portable two-kernel backward is). GQA: the program runs over its kv
head's group of query heads, so dk and dv sum the group in registers.
The semantics are semantics.py's (_query_band, _scores, _probs, _visible, _prescaled), called from Gluon as
from the portable kernels. hopper.py decides where it runs."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from .semantics import _inv, _prescaled, _probs, _query_band, _scores, _tile, _visible

# TMA loads: Triton 3.6 names them async_copy_global_to_shared, later versions async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _load_rows(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, ready, t, n_blk, lo,
               off_z, off_hk, kv_group, num_heads, seq_len_q, BLOCK_M: gl.constexpr):
    """Step t's query and dout block into slot t % STAGES: query head off_hk * kv_group + t // n_blk, rows
    lo + (t % n_blk) * BLOCK_M."""
    s = t % q_bufs.shape[0]
    g = t // n_blk
    start_m = lo + (t - g * n_blk) * BLOCK_M
    off_h = off_hk * kv_group + g
    row = (off_z * num_heads + off_h) * seq_len_q + start_m
    mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes
                    + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
    _tma_load(q_desc, [off_z, off_h, start_m, 0], ready.index(s), q_bufs.index(s))
    _tma_load(do_desc, [off_z, off_h, start_m, 0], ready.index(s), do_bufs.index(s))
    _tma_load(lse_desc, [row], ready.index(s), lse_bufs.index(s))
    _tma_load(delta_desc, [row], ready.index(s), delta_bufs.index(s))


@gluon.jit
def _dq_add(dq_ptr, dq, rows, off_z, off_h, stride_dqz, stride_dqh, stride_dqm, seq_len_q, cols, RED: gl.constexpr):
    """Add a program's dq share of query rows `rows` into the fp32 accumulator (relaxed atomics). RED: as
    red.global.add.v2.f32 (no value returned, two neighbouring columns an instruction: the wgmma layout holds
    columns in pairs)."""
    ptrs = (dq_ptr + off_z.to(gl.int64) * stride_dqz + off_h.to(gl.int64) * stride_dqh
            + rows.to(gl.int64)[:, None] * stride_dqm + cols[None, :])
    row_in = gl.broadcast((rows < seq_len_q)[:, None], ptrs)[0]
    if RED:
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $6, 0; @p red.relaxed.gpu.global.add.v2.f32 [$2], {$4, $5}; "
            "mov.b32 $0, 0; mov.b32 $1, 0; }",
            "=r,=r,l,l,f,f,r,r", [ptrs.to(gl.int64), dq, row_in.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=2)
    else:
        gl.atomic_add(ptrs, dq, mask=row_in, sem="relaxed")


@gluon.jit(do_not_specialize=["head_group"])
def _hopper_bwd_kernel(
    q_desc, v_desc, do_desc, lse_desc, delta_desc, k_ptr, dq_ptr, dk_ptr, dv_ptr,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_dqz, stride_dqh, stride_dqm,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    num_heads, seq_len_q, seq_len_k, qk_scale, scale, head_group, kv_group, win_left, win_right, cap2,
    # semantics: what is computed
    HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
    # tiles: how
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
    RED: gl.constexpr,
):
    """q_desc, do_desc: host TMA descriptors over the whole (Z, H, N_q, D) tensors in (1, 1, BLOCK_M, D)
    blocks; v_desc over (Z, H_kv, N_k, D) in (1, 1, BLOCK_N, D); k by pointer and strides (loaded once,
    prescaled in registers). lse2, delta: the preprocess's contiguous (Z, H, N_q) statistics. dq_ptr: the
    fp32 accumulator (unit stride along D), zeroed; dk, dv by pointers and strides. Grid (key blocks, kv
    heads, batch), 8 warps. Per query block t: s^T, dp^T issued; dq(t-1) waited for and added while they
    run; the softmax; ds^T to shared memory; dv, dk and dq(t) issued, dv and dk waited for."""
    gl.static_assert(gl.num_warps() == 8)
    dtype: gl.constexpr = q_desc.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, HEAD_DIM // 2, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    ds_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    k_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    k_reg_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])

    pid_n, off_hk, off_z = _tile(head_group, DEAL=CAUSAL, REVERSE=False)
    start_n = pid_n * BLOCK_N
    causal_offset = seq_len_k - seq_len_q
    lo, mid, full_end, hi = _query_band(start_n, seq_len_q, seq_len_k, causal_offset, win_left, win_right,
                                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, WINDOW=WINDOW)
    n_blk = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_M)
    total = n_blk * kv_group

    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_smem_layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    v_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(v_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.expect(v_bar, v_desc.block_type.nbytes)
    _tma_load(v_desc, [off_z, off_hk, start_n, 0], v_bar, v_smem)
    for i in gl.static_range(STAGES - 1):
        if i < total:
            _load_rows(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, ready, i, n_blk,
                       lo, off_z, off_hk, kv_group, num_heads, seq_len_q, BLOCK_M=BLOCK_M)

    # k enters the score dots prescaled by an exact power of two (_prescaled), and so dq's dots: dq_scale =
    # scale / p2 undoes it exactly
    k_rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_reg_layout))
    k_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, k_reg_layout))
    k_raw = gl.load(k_ptr + off_z.to(gl.int64) * stride_kz + off_hk.to(gl.int64) * stride_kh
                    + k_rows.to(gl.int64)[:, None] * stride_kn + k_cols[None, :] * stride_kd,
                    mask=(k_rows < seq_len_k)[:, None], other=0.0)
    k_pre, qk_rest = _prescaled(k_raw, qk_scale)
    dq_scale = scale * (qk_rest / qk_scale)
    k_s = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_smem_layout, k_pre)
    v_s = v_smem.reshape([BLOCK_N, HEAD_DIM])
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.wait(v_bar, 0)
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)

    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    zero_st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dq_tok = warpgroup_mma_init(zero_dq)
    prev_m = 0
    prev_h = 0
    for t in range(total):
        s = t % STAGES
        g = t // n_blk
        start_m = lo + (t - g * n_blk) * BLOCK_M
        off_h = off_hk * kv_group + g
        rows = start_m + offs_m
        row_in = rows < seq_len_q
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        q_s = q_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        do_s = do_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        st = warpgroup_mma(k_s, q_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_s, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        # block t-1's dq (its matmul is the oldest in flight): add it while s^T and dp^T run
        dq = warpgroup_mma_wait(2, deps=(dq_tok, ))
        gl.thread_barrier()  # both warpgroups are done with block t-1's slot and ds_smem
        if t + STAGES - 1 < total:
            _load_rows(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, ready,
                       t + STAGES - 1, n_blk, lo, off_z, off_hk, kv_group, num_heads, seq_len_q, BLOCK_M=BLOCK_M)
        if OVERLAP and t > 0:
            _dq_add(dq_ptr, dq * dq_scale, prev_m + dq_rows, off_z, prev_h, stride_dqz, stride_dqh, stride_dqm,
                    seq_len_q, dq_cols, RED=RED)
        st = warpgroup_mma_wait(1, deps=(st, ))
        s_t, t_t = _scores(st, rows[None, :], offs_n[:, None], causal_offset, qk_rest, cap2, inv_cap2, 0.0,
                           SOFTCAP=SOFTCAP, ALIBI=False)
        lse2 = lse_bufs.index(s).load(gl.SliceLayout(0, st_layout))
        p_t = _probs(s_t, lse2[None, :])
        if (start_m < mid) | (start_m >= full_end):  # _query_band's masked ranges
            vis = _visible(rows[None, :], offs_n[:, None], seq_len_k, causal_offset, win_left, win_right,
                           KEY_MASK=True, CAUSAL=CAUSAL, WINDOW=WINDOW) & row_in[None, :]
            p_t = gl.where(vis, p_t, 0.0)
        dpt = warpgroup_mma_wait(0, deps=(dpt, ))
        delta = delta_bufs.index(s).load(gl.SliceLayout(0, st_layout))
        ds_t = p_t * (dpt - delta[None, :])
        if SOFTCAP:  # d(cap * tanh(x / cap)) / dx = 1 - tanh^2
            ds_t = ds_t * (1.0 - t_t * t_t)
        ds16 = ds_t.to(dtype)
        ds_smem.store(ds16)
        fence_async_shared()
        gl.thread_barrier()
        p16 = gl.convert_layout(p_t.to(dtype), op_layout)
        ds_op = gl.convert_layout(ds16, op_layout)
        dv_tok = warpgroup_mma(p16, do_s, dv, is_async=True)
        dk_tok = warpgroup_mma(ds_op, q_s, dk, is_async=True)
        dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_s, zero_dq, use_acc=False, is_async=True)
        if OVERLAP:  # dq(t) is added in the next step, under its s^T and dp^T
            dv, dk, _p, _ds = warpgroup_mma_wait(1, deps=(dv_tok, dk_tok, p16, ds_op))
        else:
            dv, dk, dq, _p, _ds = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, dq_tok, p16, ds_op))
            _dq_add(dq_ptr, dq * dq_scale, start_m + dq_rows, off_z, off_h, stride_dqz, stride_dqh, stride_dqm,
                    seq_len_q, dq_cols, RED=RED)
            dq_tok = warpgroup_mma_init(dq)
        prev_m = start_m
        prev_h = off_h
    dq = warpgroup_mma_wait(0, deps=(dq_tok, ))
    if OVERLAP and total > 0:
        _dq_add(dq_ptr, dq * dq_scale, prev_m + dq_rows, off_z, prev_h, stride_dqz, stride_dqh, stride_dqm,
                seq_len_q, dq_cols, RED=RED)

    mbarrier.invalidate(v_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    kv_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    kv_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    key_in = (start_n + kv_rows < seq_len_k)[:, None]
    keys = (start_n + kv_rows).to(gl.int64)[:, None]
    dk_ptrs = (dk_ptr + off_z.to(gl.int64) * stride_dkz + off_hk.to(gl.int64) * stride_dkh + keys * stride_dkn
               + kv_cols[None, :] * stride_dkd)
    dv_ptrs = (dv_ptr + off_z.to(gl.int64) * stride_dvz + off_hk.to(gl.int64) * stride_dvh + keys * stride_dvn
               + kv_cols[None, :] * stride_dvd)
    gl.store(dk_ptrs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=key_in)
    gl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=key_in)
