"""v3 of the one-pass Gluon backward (offline draft): dq leaves the compute warps through shared memory to a
one-warp writer partition (red.v4 adds), dv issued before dp^T is waited for (DV_EARLY), s^T/dp^T of the
next block issued before this block's dk/dq are waited for (OVERLAP)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from diyflash.kernels.attention.semantics import _inv, _prescaled, _probs, _query_band, _scores, _tile, _visible

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _step(t, n_blk, lo, off_hk, kv_group, BLOCK_M: gl.constexpr):
    g = t // n_blk
    return lo + (t - g * n_blk) * BLOCK_M, off_hk * kv_group + g


@gluon.jit
def _load_rows(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, ready, t, n_blk, lo,
               off_z, off_hk, kv_group, num_heads, seq_len_q, BLOCK_M: gl.constexpr):
    s = t % q_bufs.shape[0]
    start_m, off_h = _step(t, n_blk, lo, off_hk, kv_group, BLOCK_M=BLOCK_M)
    row = (off_z * num_heads + off_h) * seq_len_q + start_m
    mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes
                    + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
    _tma_load(q_desc, [off_z, off_h, start_m, 0], ready.index(s), q_bufs.index(s))
    _tma_load(do_desc, [off_z, off_h, start_m, 0], ready.index(s), do_bufs.index(s))
    _tma_load(lse_desc, [row], ready.index(s), lse_bufs.index(s))
    _tma_load(delta_desc, [row], ready.index(s), delta_bufs.index(s))


@gluon.jit
def _dq_writer(dq_bufs, dq_full, dq_empty, dq_ptr, stride_dqz, stride_dqh, stride_dqm, total, n_blk, lo, off_z,
               off_hk, kv_group, seq_len_q, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):
    """The writer partition (one warp): each block's dq share from its shared-memory slot into the fp32
    accumulator, a row at a time, four neighbouring columns a red.global.add.v4.f32."""
    row_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [1, 1], [1, 0])
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, row_layout))[None, :]
    for t in range(total):
        b = t % 2
        start_m, off_h = _step(t, n_blk, lo, off_hk, kv_group, BLOCK_M=BLOCK_M)
        base = dq_ptr + off_z.to(gl.int64) * stride_dqz + off_h.to(gl.int64) * stride_dqh
        mbarrier.wait(dq_full.index(b), (t // 2) & 1)
        buf = dq_bufs.index(b)
        for r in gl.static_range(BLOCK_M):
            vals = buf.slice(r, 1, dim=0).load(row_layout)
            ptrs = base + (start_m + r).to(gl.int64) * stride_dqm + cols
            live = gl.full([1, HEAD_DIM], start_m + r < seq_len_q, gl.int32, row_layout)
            gl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $12, 0; @p red.relaxed.gpu.global.add.v4.f32 [$4], {$8, $9, $10, $11}; "
                "mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; }",
                "=r,=r,=r,=r,l,l,l,l,f,f,f,f,r,r,r,r", [ptrs.to(gl.int64), vals, live], dtype=gl.int32, is_pure=False,
                pack=4)
        mbarrier.arrive(dq_empty.index(b), count=1)


@gluon.jit
def _compute(q_bufs, do_bufs, lse_bufs, delta_bufs, ready, k_s, v_s, v_bar, ds_smem, dq_bufs, dq_full, dq_empty,
             q_desc, do_desc, lse_desc, delta_desc, k_ptr, dk_ptr, dv_ptr,
             stride_kz, stride_kh, stride_kn, stride_kd, stride_dkz, stride_dkh, stride_dkn, stride_dkd,
             stride_dvz, stride_dvh, stride_dvn, stride_dvd,
             total, n_blk, lo, mid, full_end, off_z, off_hk, start_n, num_heads, seq_len_q, seq_len_k,
             causal_offset, qk_scale, scale, kv_group, win_left, win_right, cap2,
             HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
             DV_EARLY: gl.constexpr):
    dtype: gl.constexpr = k_s.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, HEAD_DIM // 2, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    k_reg_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])

    k_rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_reg_layout))
    k_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, k_reg_layout))
    k_raw = gl.load(k_ptr + off_z.to(gl.int64) * stride_kz + off_hk.to(gl.int64) * stride_kh
                    + k_rows.to(gl.int64)[:, None] * stride_kn + k_cols[None, :] * stride_kd,
                    mask=(k_rows < seq_len_k)[:, None], other=0.0)
    k_pre, qk_rest = _prescaled(k_raw, qk_scale)
    dq_scale = scale * (qk_rest / qk_scale)
    k_s.store(k_pre)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.wait(v_bar, 0)
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)

    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    zero_st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dq_tok = warpgroup_mma_init(zero_dq)
    for t in range(total):
        s = t % STAGES
        start_m, off_h = _step(t, n_blk, lo, off_hk, kv_group, BLOCK_M=BLOCK_M)
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        q_s = q_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        do_s = do_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        st = warpgroup_mma(k_s, q_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_s, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        if OVERLAP:  # block t-1's dq finishes under these two
            dq = warpgroup_mma_wait(2, deps=(dq_tok, ))
            if t > 0:
                b = (t - 1) % 2
                mbarrier.wait(dq_empty.index(b), (((t - 1) // 2) & 1) ^ 1)
                dq_bufs.index(b).store(dq * dq_scale)
                mbarrier.arrive(dq_full.index(b), count=1)
            gl.thread_barrier()  # block t-1's slot and ds_smem are free
        if t + STAGES - 1 < total:
            _load_rows(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, ready,
                       t + STAGES - 1, n_blk, lo, off_z, off_hk, kv_group, num_heads, seq_len_q, BLOCK_M=BLOCK_M)
        rows = start_m + offs_m
        st = warpgroup_mma_wait(1, deps=(st, ))
        s_t, t_t = _scores(st, rows[None, :], offs_n[:, None], causal_offset, qk_rest, cap2, inv_cap2, 0.0,
                           SOFTCAP=SOFTCAP, ALIBI=False)
        lse2 = lse_bufs.index(s).load(gl.SliceLayout(0, st_layout))
        p_t = _probs(s_t, lse2[None, :])
        if (start_m < mid) | (start_m >= full_end):
            vis = _visible(rows[None, :], offs_n[:, None], seq_len_k, causal_offset, win_left, win_right,
                           KEY_MASK=True, CAUSAL=CAUSAL, WINDOW=WINDOW) & (rows < seq_len_q)[None, :]
            p_t = gl.where(vis, p_t, 0.0)
        p16 = gl.convert_layout(p_t.to(dtype), op_layout)
        if DV_EARLY:  # p^T dout runs while ds is computed
            dv_tok = warpgroup_mma(p16, do_s, dv, is_async=True)
            dpt, _p = warpgroup_mma_wait(1, deps=(dpt, p16))
        else:
            dpt = warpgroup_mma_wait(0, deps=(dpt, ))
        delta = delta_bufs.index(s).load(gl.SliceLayout(0, st_layout))
        ds_t = p_t * (dpt - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        ds16 = ds_t.to(dtype)
        ds_smem.store(ds16)
        fence_async_shared()
        gl.thread_barrier()
        ds_op = gl.convert_layout(ds16, op_layout)
        if not DV_EARLY:
            dv_tok = warpgroup_mma(p16, do_s, dv, is_async=True)
        dk_tok = warpgroup_mma(ds_op, q_s, dk, is_async=True)
        dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_s, zero_dq, use_acc=False, is_async=True)
        if OVERLAP:
            dv, dk, _p2, _ds = warpgroup_mma_wait(1, deps=(dv_tok, dk_tok, p16, ds_op))
        else:
            dv, dk, dq, _p2, _ds = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, dq_tok, p16, ds_op))
            dq_tok = warpgroup_mma_init(dq)
            b = t % 2
            mbarrier.wait(dq_empty.index(b), ((t // 2) & 1) ^ 1)
            dq_bufs.index(b).store(dq * dq_scale)
            mbarrier.arrive(dq_full.index(b), count=1)
            gl.thread_barrier()  # this block's slot and ds_smem are free
    dq = warpgroup_mma_wait(0, deps=(dq_tok, ))
    if OVERLAP and total > 0:
        b = (total - 1) % 2
        mbarrier.wait(dq_empty.index(b), (((total - 1) // 2) & 1) ^ 1)
        dq_bufs.index(b).store(dq * dq_scale)
        mbarrier.arrive(dq_full.index(b), count=1)

    kv_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    kv_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    key_in = (start_n + kv_rows < seq_len_k)[:, None]
    keys = (start_n + kv_rows).to(gl.int64)[:, None]
    gl.store(dk_ptr + off_z.to(gl.int64) * stride_dkz + off_hk.to(gl.int64) * stride_dkh + keys * stride_dkn
             + kv_cols[None, :] * stride_dkd, (dk * scale).to(dk_ptr.dtype.element_ty), mask=key_in)
    gl.store(dv_ptr + off_z.to(gl.int64) * stride_dvz + off_hk.to(gl.int64) * stride_dvh + keys * stride_dvn
             + kv_cols[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=key_in)


@gluon.jit(do_not_specialize=["head_group"])
def _hopper_bwd_kernel(
    q_desc, v_desc, do_desc, lse_desc, delta_desc, k_ptr, dq_ptr, dk_ptr, dv_ptr,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_dqz, stride_dqh, stride_dqm,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    num_heads, seq_len_q, seq_len_k, qk_scale, scale, head_group, kv_group, win_left, win_right, cap2,
    HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
    DV_EARLY: gl.constexpr, WRITER_REGS: gl.constexpr,
):
    gl.static_assert(gl.num_warps() == 8)
    dtype: gl.constexpr = q_desc.dtype
    pid_n, off_hk, off_z = _tile(head_group, DEAL=CAUSAL, REVERSE=False)
    start_n = pid_n * BLOCK_N
    causal_offset = seq_len_k - seq_len_q
    lo, mid, full_end, hi = _query_band(start_n, seq_len_q, seq_len_k, causal_offset, win_left, win_right,
                                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, WINDOW=WINDOW)
    n_blk = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_M)
    total = n_blk * kv_group

    k_s = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype))
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    dq_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    v_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(v_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    mbarrier.expect(v_bar, v_desc.block_type.nbytes)
    _tma_load(v_desc, [off_z, off_hk, start_n, 0], v_bar, v_smem)
    for i in gl.static_range(STAGES - 1):
        if i < total:
            _load_rows(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, ready, i, n_blk,
                       lo, off_z, off_hk, kv_group, num_heads, seq_len_q, BLOCK_M=BLOCK_M)
    v_s = v_smem.reshape([BLOCK_N, HEAD_DIM])
    gl.warp_specialize([
        (_compute, (q_bufs, do_bufs, lse_bufs, delta_bufs, ready, k_s, v_s, v_bar, ds_smem, dq_bufs, dq_full,
                    dq_empty, q_desc, do_desc, lse_desc, delta_desc, k_ptr, dk_ptr, dv_ptr,
                    stride_kz, stride_kh, stride_kn, stride_kd, stride_dkz, stride_dkh, stride_dkn, stride_dkd,
                    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
                    total, n_blk, lo, mid, full_end, off_z, off_hk, start_n, num_heads, seq_len_q, seq_len_k,
                    causal_offset, qk_scale, scale, kv_group, win_left, win_right, cap2,
                    HEAD_DIM, CAUSAL, WINDOW, SOFTCAP, BLOCK_M, BLOCK_N, STAGES, OVERLAP, DV_EARLY)),
        (_dq_writer, (dq_bufs, dq_full, dq_empty, dq_ptr, stride_dqz, stride_dqh, stride_dqm, total, n_blk, lo,
                      off_z, off_hk, kv_group, seq_len_q, BLOCK_M, HEAD_DIM)),
    ], [1], [WRITER_REGS])
