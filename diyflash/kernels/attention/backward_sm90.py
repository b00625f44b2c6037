"""The Hopper (sm_90) backward: one pass in FlashAttention-3's split, a warp-specialized Gluon kernel (D64, D128).

A program holds one block of BLOCK_N = 128 keys of one (batch, kv head) and walks the query blocks that see
it (every query head of the kv head's group, _query_band's rows, in _next_step's order), BLOCK_M rows a step (64, or
128 at head_dim 64 without masks: hopper.BWD_WIDE_TILES).
Partitions:
- two MMA warpgroups (the default partition and one worker), each owning 64 of the keys and their dk, dv
  accumulators: per step s^T = k_w q^T and dp^T = v_w do^T (asynchronous wgmma; at D64 k_w and v_w are held
  in registers, KV_REGS), p^T from the saved base-2 lse, dv_w += p^T do (p^T from registers),
  ds^T = p^T (dp^T - delta), dk_w += ds^T q (ds^T from registers) and ds^T into shared memory; at D128
  (STATS_ACC) s^T's and dp^T's accumulators start at -lse2 / qk_rest and -delta, so p^T and ds^T load no stat
  after the matmuls' waits (1.03-1.05x the kernel that loaded them there, H200,
  bench/results/onepass_backward_h200.jsonl, run "bwd stats in acc"), rows the preprocess stores so shifted
  (semantics._stats_shifted);
  once dk and dv are done, dq_w = ds k[:, w*64:(w+1)*64] (the 64 columns of dq this warpgroup owns, ds . k_pre:
  the convert pass undoes k's prescale, so no multiply sits between dq's wait and its store) into a shared fp32
  tile, its share over the warpgroup's own keys issued before the wait for the other warpgroup's half of ds^T
  (an mbarrier of count 2), the rest after; with two dq buffers a warpgroup, the tile is handed to the writer
  under the next step's first matmuls (DQ_LATE). dq is issued after dk and dv are waited for: three accumulators
  in flight made ptxas serialize every wgmma (tests/test_hopper.py checks);
- a loader warp: k and v once, then q, do, lse and delta of each step into STAGES slots (TMA; packed
  sequences' lse and delta rows start anywhere, unaligned for the TMA: the warp loads those itself);
- a writer warp: each step's dq tile added into the fp32 accumulator by the TMA unit (a bulk tensor
  reduce-add), where a warp of red.global.add.v4 instructions held the kernel at 0.61-0.80x of the TMA form's
  speed (bench/results/onepass_backward_h200.jsonl, run "fa3 split"). Each MMA warpgroup stores its half of
  the tile in its registers' order, one flat chunk of the accumulator, which one reduce adds as soon as that
  half is in (_store_dq; as FlashAttention-3 does): 1.02-1.06x at D128 against 128-byte swizzled panels,
  whose 64-bit stores met 2-way bank conflicts (run "dq in register order"); DQ_BUFS buffers a warpgroup in
  turns (hopper.BWD_TILES). Packed sequences' tiles start at any row: they keep the panels (DQ_BUFS tiles in
  turns), clipped by the TMA at the tensor's rows.
Semantics are semantics.py's (_sequence, _query_band, _scores, _probs, _visible, _prescaled), the tile order
tile_order.py's (_tile). dk and dv are written by the program that owns the keys (no atomics); dq's adds land in
any order (not deterministic: launch_bwd.attention_bwd runs it only where determinism is not asked for). hopper.py
decides where it runs."""

from __future__ import annotations

from triton._C.libtriton import gluon_ir as _gluon_ir
from triton._C.libtriton import ir as _ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin as _builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .semantics import _inv, _prescaled, _probs, _probs_shifted, _query_band, _scores, _sequence, _visible
from .tile_order import _tile

# TMA loads: Triton 3.6 names them async_copy_global_to_shared, later versions async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# a barrier of the calling warps (a partition's own, inside warp_specialize): thread_barrier in 3.6, barrier later
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


if not (hasattr(_ir, "DESCRIPTOR_REDUCE_KIND") and hasattr(_gluon_ir.GluonOpBuilder, "create_async_tma_reduce")):
    # checked here, at import (hopper.backward_module), not at the first compile
    raise ImportError("this Triton's Gluon builder has no TMA reduce (create_async_tma_reduce)")


@_builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """src (shared memory) added into tensor_desc's block at coord by the TMA unit (cp.reduce.async.bulk.tensor,
    one bulk group; tma.store_wait waits for its reads). Gluon's Hopper module has no wrapper for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


SIDE_REGS = gl.constexpr(32)  # the loader's and the writer's registers a thread (setmaxnreg)


@gluon.jit
def _own_regs(x):
    """x with each element in its own register, copied here (kept in order: it has side effects): a broadcast
    tile (one value in several of a thread's registers) that a wgmma accumulates into would otherwise get
    its copies between the wgmma's fence and its issue, where ptxas then waits for the matmuls in flight
    (C7517)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _first_step(n_blk, heads, BY_ROW: gl.constexpr):
    """The first step's (row block, head) of a program's heads query heads (see _next_step): row block 0, or the
    last one where _next_step walks the row blocks down."""
    r = n_blk * 0  # tensors, whichever counts are constexpr (a count of 1 is)
    if BY_ROW:
        if heads > 1:
            r = n_blk - 1
    return r, n_blk * 0


@gluon.jit
def _next_step(r, g, n_blk, heads, BY_ROW: gl.constexpr):
    """The step after (row block r, head g). BY_ROW (the kernel's choice where every program's band ends at the
    same row: no window), with more than one head (GQA): the band's row blocks from the last down, every head a
    row block, so that the programs of a kv head started together read each row block's q and do, and add into
    its dq, at the same step whatever their keys: L2 keeps what they share (a causal grid's programs walking each
    head's band in turn drifted apart by their band's length at every head: GQA 64/8 D128 causal bf16 B1 N16384
    503 -> 527 TFLOPS; bench/results/onepass_backward_h200.jsonl, run "row order"). Else the heads one after the
    other, each over its band from its first row: a window's bands are shifted copies, which this order walks a
    row block a step (every head a row block spaced the programs' shared rows heads times further apart in time:
    window 4096 GQA 32/8 510-513 -> 435-439 TFLOPS, run "order ab"). Counted on from the step before, not divided
    out of the step's number: exact at any count, and the integer division by a runtime count (~25 SASS
    instructions) leaves every GQA and window step (run "bwd step count": never slower)."""
    if BY_ROW:
        g += 1
        wrap = (g == heads).to(gl.int32)
        g -= wrap * heads
        if heads > 1:  # from the last row block down (_first_step)
            r -= wrap
        else:
            r += wrap
    else:
        r += 1
        wrap = (r == n_blk).to(gl.int32)
        r -= wrap * n_blk
        g += wrap
    return r, g


@gluon.jit
def _loader(k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, lse_ptr, delta_ptr, k_s, v_s, kv_bar, q_bufs,
            do_bufs, lse_bufs, delta_bufs, ready, empty, total, n_blk, lo, off_z, z_in, q_start, k_start, q_len,
            off_hk, start_n, head0, heads, num_heads, stat_stride, VARLEN: gl.constexpr, BLOCK_M: gl.constexpr,
            BY_ROW: gl.constexpr, STATS_ACC: gl.constexpr):
    """z_in, q_start, k_start: the sequence's batch slice and first rows in the tensors (0, and its offsets,
    for packed sequences: _sequence). VARLEN: a packed sequence's stats start at any row, where the TMA needs
    16-byte aligned coordinates: this warp loads them (rows past q_len: lse2 +inf, or with STATS_ACC the shifted
    -inf; delta 0) into the slot before it arrives on the slot's barrier, ahead of the MMA warpgroups as the TMA
    loads are."""
    STAGES: gl.constexpr = q_bufs.shape[0]
    NO_ROW: gl.constexpr = float("-inf") if STATS_ACC else float("inf")  # p = 0 there (_stats_shifted)
    stat_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [z_in, off_hk, k_start + start_n, 0], kv_bar, k_s)
    _tma_load(v_desc, [z_in, off_hk, k_start + start_n, 0], kv_bar, v_s)
    r, g = _first_step(n_blk, heads, BY_ROW=BY_ROW)
    for t in range(total):
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
        start_m, off_h = lo + r * BLOCK_M, head0 + g
        r, g = _next_step(r, g, n_blk, heads, BY_ROW=BY_ROW)
        if VARLEN:
            rows = start_m + gl.arange(0, BLOCK_M, layout=stat_layout)
            at = off_h.to(gl.int64) * stat_stride + q_start + rows
            lse_bufs.index(s).store(gl.load(lse_ptr + at, mask=rows < q_len, other=NO_ROW))
            delta_bufs.index(s).store(gl.load(delta_ptr + at, mask=rows < q_len, other=0.0))
            _barrier()  # the warp's stores before the arrive below (it releases them to the waiting warpgroups)
            mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        else:
            row = (off_z * num_heads + off_h) * stat_stride + start_m  # the stats' rows: 16-byte aligned a head
            mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
            _tma_load(lse_desc, [row], ready.index(s), lse_bufs.index(s))
            _tma_load(delta_desc, [row], ready.index(s), delta_bufs.index(s))
        _tma_load(q_desc, [z_in, off_h, q_start + start_m, 0], ready.index(s), q_bufs.index(s))
        _tma_load(do_desc, [z_in, off_h, q_start + start_m, 0], ready.index(s), do_bufs.index(s))


@gluon.jit
def _writer(dq_desc, dq_bufs, dq_full, dq_empty, total, n_blk, lo, z_in, q_start, head0, heads, num_heads, dq_rows,
            HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, FLAT: gl.constexpr, BY_ROW: gl.constexpr):
    """Each step's dq tile added into the fp32 accumulator by the TMA unit; a buffer is free again once the
    unit has read it. FLAT (_store_dq): each warpgroup's half, a chunk of (64 x D/2) / 256 rows of 256 floats
    of the (Z, H, dq_rows, D) accumulator (dq_rows: hopper.bwd_dq_rows), reduced as soon as it is in (a
    128-row step's half: two chunks, one a 64-row tile).
    Else the tile's panels of the (Z, H, N_q, D) accumulator once both halves are in. DQ_BUFS buffers (a
    warpgroup's, or a tile's) in turns. A tile's rows past the sequence hold zeros (their p is masked): for
    packed sequences the next sequence's rows get +0, as does the next head's first 64-row tile from a 128-row
    step past a head's rows."""
    if FLAT:
        CHUNK: gl.constexpr = dq_desc.block_type.shape[0]  # rows of 256 floats a warpgroup's half of 64 rows
        SUBS: gl.constexpr = BLOCK_M // 64  # 64-row tiles a step
        DQ_BUFS: gl.constexpr = dq_full.shape[0] // 2  # a warpgroup's (1 or 2)
        head_z = z_in * num_heads
        r, g = _first_step(n_blk, heads, BY_ROW=BY_ROW)
        for t in range(total):
            start_m, off_h = lo + r * BLOCK_M, head0 + g
            r, g = _next_step(r, g, n_blk, heads, BY_ROW=BY_ROW)
            row = (((head_z + off_h).to(gl.int64) * dq_rows + start_m) * HEAD_DIM // 256).to(gl.int32)
            b = t % DQ_BUFS
            for w in gl.static_range(2):
                mbarrier.wait(dq_full.index(b * 2 + w), (t // DQ_BUFS) & 1)
                for a in gl.static_range(SUBS):
                    _tma_reduce_add(dq_desc, [row + (2 * a + w) * CHUNK, 0],
                                    dq_bufs.index(b * 2 + w).slice(a * CHUNK, CHUNK, dim=0))
            if DQ_BUFS == 1:  # each half's buffer free once its reduce has read it
                tma.store_wait(SUBS)
                mbarrier.arrive(dq_empty.index(0), count=1)
                tma.store_wait(0)
                mbarrier.arrive(dq_empty.index(1), count=1)
            elif t > 0:  # two: the step before's buffers, once its reduces are done
                tma.store_wait(2 * SUBS)
                mbarrier.arrive(dq_empty.index((1 - b) * 2), count=1)
                mbarrier.arrive(dq_empty.index((1 - b) * 2 + 1), count=1)
        tma.store_wait(0)
    else:
        DQ_BUFS: gl.constexpr = dq_full.shape[0]
        PANELS: gl.constexpr = dq_bufs.shape[0] // DQ_BUFS
        PANEL: gl.constexpr = dq_bufs.shape[4]  # dq's columns a TMA reduce (its descriptor's block)
        r, g = _first_step(n_blk, heads, BY_ROW=BY_ROW)
        for t in range(total):
            start_m, off_h = lo + r * BLOCK_M, head0 + g
            r, g = _next_step(r, g, n_blk, heads, BY_ROW=BY_ROW)
            b = t % DQ_BUFS
            mbarrier.wait(dq_full.index(b), (t // DQ_BUFS) & 1)
            for j in gl.static_range(PANELS):
                _tma_reduce_add(dq_desc, [z_in, off_h, q_start + start_m, j * PANEL], dq_bufs.index(b * PANELS + j))
            tma.store_wait(0)
            mbarrier.arrive(dq_empty.index(b), count=1)


@gluon.jit
def _store_dq(dq, dq_bufs, dq_empty, t, W: gl.constexpr, FLAT: gl.constexpr):
    """MMA warpgroup W's half of step t's dq tile (BLOCK_M rows x D/2 columns, fp32) into shared memory for the
    writer warp, DQ_BUFS buffers in turns (_dq_slot's), once the writer is done with the buffer; _publish_dq hands
    it over. FLAT: in the accumulator registers' order, into the warpgroup's
    own buffers, a 64-row tile after the other, element (r, c) of a tile at (c // 8) * 512 + (32 * (r // 16)
    + 4 * (r % 8) + c % 8 // 2) * 4 + 2 * (r // 8 % 2) + c % 2, so that thread t's registers 4i .. 4i+3 land at
    i * 512 + t * 4 (128-bit stores, a warp's 512 bytes in a row: no bank conflicts; a 128-row tile's second
    64 rows are its registers after the first's); backward_rows._dq_flat_offset reads it back.
    Else the tile's 128-byte swizzled panels (one a warpgroup at D64, two at D128; 64-bit stores)."""
    if FLAT:
        H2: gl.constexpr = dq.shape[1]
        SUBS: gl.constexpr = dq.shape[0] // 64
        DQ_BUFS: gl.constexpr = dq_empty.shape[0] // 2
        i = _dq_slot(t, dq_empty.shape[0], W=W, FLAT=FLAT)
        # (r // 64, r // 16 % 4, r // 8 % 2, r % 8, c // 8, c % 8 // 2, c % 2), then a 64-row tile after the
        # other, each in the order of the offset above
        x = gl.permute(gl.reshape(dq, [SUBS, 4, 2, 8, H2 // 8, 4, 2]), (0, 4, 1, 3, 5, 2, 6))
        mbarrier.wait(dq_empty.index(i), ((t // DQ_BUFS) & 1) ^ 1)
        dq_bufs.index(i).store(gl.reshape(x, [dq_bufs.shape[1], 256]))
    else:
        DQ_BUFS: gl.constexpr = dq_empty.shape[0]
        PANELS: gl.constexpr = dq_bufs.shape[0] // DQ_BUFS
        PANEL: gl.constexpr = dq_bufs.shape[4]
        M: gl.constexpr = dq.shape[0]
        qb = _dq_slot(t, DQ_BUFS, W=W, FLAT=FLAT)
        mbarrier.wait(dq_empty.index(qb), ((t // DQ_BUFS) & 1) ^ 1)
        if dq.shape[1] == PANEL:
            dq_bufs.index(qb * PANELS + W).reshape([M, PANEL]).store(dq)
        else:
            dq0, dq1 = gl.split(gl.permute(gl.reshape(dq, [M, 2, PANEL]), (0, 2, 1)))
            dq_bufs.index(qb * PANELS + 2 * W).reshape([M, PANEL]).store(dq0)
            dq_bufs.index(qb * PANELS + 2 * W + 1).reshape([M, PANEL]).store(dq1)


@gluon.jit
def _publish_dq(dq_full, t, W: gl.constexpr, FLAT: gl.constexpr):
    """Step t's dq tile, stored by _store_dq, handed to the writer: the proxy fence that orders the warpgroup's
    stores before the TMA unit's reads, its barrier, the arrive."""
    fence_async_shared()
    _barrier()
    mbarrier.arrive(dq_full.index(_dq_slot(t, dq_full.shape[0], W=W, FLAT=FLAT)), count=1)


@gluon.jit
def _dq_slot(t, n: gl.constexpr, W: gl.constexpr, FLAT: gl.constexpr):
    """Step t's dq buffer (and its dq_full and dq_empty barriers) of n: FLAT, warpgroup W's of its n // 2 in turns;
    else the tile's, both warpgroups', n in turns."""
    if FLAT:
        return (t % (n // 2)) * 2 + W
    else:
        return t % n


@gluon.jit
def _mma(k_s, v_s, kv_bar, q_bufs, do_bufs, lse_bufs, delta_bufs, ready, empty, ds_bufs, ds_ready, dq_bufs, dq_full,
         dq_empty, dk_ptr, dv_ptr, stride_dkz, stride_dkh, stride_dkn, stride_dkd, stride_dvz, stride_dvh,
         stride_dvn, stride_dvd, total, n_blk, lo, mid, full_end, z_in, k_start, off_hp, start_n, q_len, kv_len,
         key_rows, causal_offset, qk_scale, scale, head0, heads, win_left, win_right, cap2, CAUSAL: gl.constexpr,
         WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
         W: gl.constexpr, FLAT: gl.constexpr, KV_REGS: gl.constexpr, BY_ROW: gl.constexpr,
         STATS_ACC: gl.constexpr, DQ_LATE: gl.constexpr):
    """MMA warpgroup W: keys start_n + W * KEYS onward, and dq's columns W * HEAD_DIM / 2 onward; dk and dv
    stored as head off_hp of dk_ptr and dv_ptr (the kv head, or its partial sums' part), rows below key_rows
    (the tensor's rows, or the packed sequence's: the next ones are another program's). KV_REGS: the
    warpgroup's k and v held in registers as s^T's and dp^T's A operands (read from shared memory once, not
    every step). STATS_ACC (not SOFTCAP): s^T's and dp^T's accumulators start at -lse2 / qk_rest and -delta, so
    that p and ds need no stat after the matmuls' waits (semantics._probs_shifted); the stat rows hold them so
    (semantics._stats_shifted), broadcast into the tiles as they are. DQ_LATE: each step's dq tile handed to the
    writer (_publish_dq) after the next step's s^T and dp^T are issued, the last one after the loop."""
    STAGES: gl.constexpr = q_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_s.shape[2]  # the program's keys (k's descriptor block)
    KEYS: gl.constexpr = BLOCK_N // 2  # this warpgroup's
    dtype: gl.constexpr = k_s.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM // 2, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    st_op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=2)
    k_reg_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])

    k_all = k_s.reshape([BLOCK_N, HEAD_DIM])
    k_w = k_all.slice(W * KEYS, KEYS, dim=0)
    v_w = v_s.reshape([BLOCK_N, HEAD_DIM]).slice(W * KEYS, KEYS, dim=0)
    mbarrier.wait(kv_bar, 0)
    # k times the power of two of the scale, in place (semantics._prescaled): the raw dot stays in fp32's range
    k_pre, qk_rest = _prescaled(k_w.load(k_reg_layout), qk_scale)
    k_w.store(k_pre)
    fence_async_shared()
    _barrier()
    if KV_REGS:
        k_a = k_w.load(st_op_layout)
        v_a = v_w.load(st_op_layout)
    else:
        k_a = k_w
        v_a = v_w
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)

    offs_n = start_n + W * KEYS + gl.arange(0, KEYS, layout=gl.SliceLayout(1, st_layout))
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    zero_st = gl.zeros([KEYS, BLOCK_M], gl.float32, st_layout)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM // 2], gl.float32, dq_layout)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    r, g = _first_step(n_blk, heads, BY_ROW=BY_ROW)
    for t in range(total):
        s = t % STAGES
        b = t % 2
        start_m, off_h = lo + r * BLOCK_M, head0 + g
        r, g = _next_step(r, g, n_blk, heads, BY_ROW=BY_ROW)
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        q_s = q_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        do_s = do_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        if STATS_ACC:  # s^T and dp^T come out of their matmuls with lse2 / qk_rest and delta subtracted
            neg_lse = lse_bufs.index(s).load(gl.SliceLayout(0, st_layout))  # -lse2 / qk_rest
            neg_delta = delta_bufs.index(s).load(gl.SliceLayout(0, st_layout))
            st0 = _own_regs(gl.broadcast(neg_lse[None, :], zero_st)[0])
            dpt0 = _own_regs(gl.broadcast(neg_delta[None, :], zero_st)[0])
            st = warpgroup_mma(k_a, q_s.permute((1, 0)), st0, use_acc=True, is_async=True)
            dpt = warpgroup_mma(v_a, do_s.permute((1, 0)), dpt0, use_acc=True, is_async=True)
        else:
            st = warpgroup_mma(k_a, q_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v_a, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        if DQ_LATE:  # the step before's dq tile handed to the writer under this step's first matmuls
            if t > 0:
                _publish_dq(dq_full, t - 1, W=W, FLAT=FLAT)
        st = warpgroup_mma_wait(1, deps=(st, ))
        rows = start_m + offs_m
        if STATS_ACC:
            t_t = st  # softcap's tanh: unused here (STATS_ACC is off with softcap)
            p_t = _probs_shifted(st, qk_rest)
        else:
            s_t, t_t = _scores(st, rows[None, :], offs_n[:, None], causal_offset, qk_rest, cap2, inv_cap2, 0.0,
                               SOFTCAP=SOFTCAP, ALIBI=False)
            lse2 = lse_bufs.index(s).load(gl.SliceLayout(0, st_layout))
            p_t = _probs(s_t, lse2[None, :])
        if (start_m < mid) | (start_m >= full_end):
            vis = _visible(rows[None, :], offs_n[:, None], kv_len, causal_offset, win_left, win_right,
                           KEY_MASK=True, CAUSAL=CAUSAL, WINDOW=WINDOW) & (rows < q_len)[None, :]
            p_t = gl.where(vis, p_t, 0.0)
        p16 = gl.convert_layout(p_t.to(dtype), op_layout)
        dv = warpgroup_mma(p16, do_s, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=(dpt, ))
        if STATS_ACC:
            ds_t = p_t * dpt
        else:
            delta = delta_bufs.index(s).load(gl.SliceLayout(0, st_layout))
            ds_t = p_t * (dpt - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        ds_all = ds_bufs.index(b)
        ds16 = ds_t.to(dtype)
        ds_all.slice(W * KEYS, KEYS, dim=0).store(ds16)  # for dq, which takes both warpgroups' keys
        fence_async_shared()
        # ds^T from registers: 16 KB less of shared-memory reads a step than from its buffer (1.00-1.02x,
        # bench/results/onepass_backward_h200.jsonl, run "dk from registers")
        dk = warpgroup_mma(gl.convert_layout(ds16, op_layout), q_s, dk, is_async=True)
        # every warp's ds stored before the arrive publishes them; here, not before dk's issue, it is the barrier
        # the compiler puts before an arrive anyway: one BAR.SYNC a step fewer, 0.993-1.014x on seven cells
        # (bench/results/onepass_backward_h200.jsonl, runs "barriers a step")
        _barrier()
        mbarrier.arrive(ds_ready.index(b), count=1)
        k_cols = k_all.slice(W * (HEAD_DIM // 2), HEAD_DIM // 2, dim=1)
        # dq over this warpgroup's own keys first, issued before the wait for the other warpgroup's half of ds,
        # so that the tensor cores have it while the warpgroup that finished its ds first waits (ncu: warpgroup 1
        # seven times warpgroup 0's samples there): 1.006-1.012x on four of six cells, 0.991-0.998x (within their
        # spread) on the MHA D128 ones (bench/results/onepass_backward_h200.jsonl, run "bwd dq split")
        dv, dk, _p = warpgroup_mma_wait(0, deps=(dv, dk, p16))
        dq = warpgroup_mma(ds_all.slice(W * KEYS, KEYS, dim=0).permute((1, 0)), k_cols.slice(W * KEYS, KEYS, dim=0),
                           zero_dq, use_acc=False, is_async=True)
        mbarrier.wait(ds_ready.index(b), (t // 2) & 1)  # the other warpgroup's keys of ds are in too
        dq = warpgroup_mma(ds_all.slice((1 - W) * KEYS, KEYS, dim=0).permute((1, 0)),
                           k_cols.slice((1 - W) * KEYS, KEYS, dim=0), dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq, ))
        mbarrier.arrive(empty.index(s), count=1)
        _store_dq(dq, dq_bufs, dq_empty, t, W=W, FLAT=FLAT)
        if not DQ_LATE:
            _publish_dq(dq_full, t, W=W, FLAT=FLAT)

    if DQ_LATE:
        if total > 0:
            _publish_dq(dq_full, total - 1, W=W, FLAT=FLAT)
    kv_rows = start_n + W * KEYS + gl.arange(0, KEYS, layout=gl.SliceLayout(1, kv_layout))
    kv_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    key_in = (kv_rows < key_rows)[:, None]  # keys past kv_len (seq_lens) get zeros: their p was masked
    keys = (k_start + kv_rows).to(gl.int64)[:, None]
    gl.store(dk_ptr + z_in.to(gl.int64) * stride_dkz + off_hp.to(gl.int64) * stride_dkh + keys * stride_dkn
             + kv_cols[None, :] * stride_dkd, (dk * scale).to(dk_ptr.dtype.element_ty), mask=key_in)
    gl.store(dv_ptr + z_in.to(gl.int64) * stride_dvz + off_hp.to(gl.int64) * stride_dvh + keys * stride_dvn
             + kv_cols[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=key_in)


@gluon.jit(do_not_specialize=["head_group"])
def _hopper_bwd_kernel(
    k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, dq_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    seq_lens_ptr, cu_k_ptr,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    num_heads, seq_len_q, seq_len_k, qk_scale, scale, head_group, kv_group, parts, stat_stride, dq_rows,
    win_left, win_right, cap2,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, HAS_SEQ_LENS: gl.constexpr,
    VARLEN: gl.constexpr,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, DQ_BUFS: gl.constexpr,
    MMA_REGS: gl.constexpr, KV_REGS: gl.constexpr, STATS_ACC: gl.constexpr,
):
    """Grid (key blocks, kv heads x parts, batch): a program takes kv_group / parts query heads of its kv head
    (grids.head_split: more programs for a small grid), and dk_ptr, dv_ptr are then fp32 partial sums
    (Z, H_kv * parts, N_k, D) that a last launch adds up. k_desc, v_desc: (1, 1, BLOCK_N, D) blocks of (Z, H_kv, N_k, D);
    q_desc, do_desc: (1, 1, BLOCK_M, D) blocks of (Z, H, N_q, D); lse_desc, delta_desc: BLOCK_M blocks of the
    flat (Z * H * stat_stride) base-2 lse and delta (stat_stride >= N_q rows a head, a multiple of 4: TMA
    coordinates 16-byte aligned); dq_desc: the fp32 accumulator, zeroed before (the preprocess) and scaled
    after (the convert pass): (CHUNK, 256) blocks of its floats in rows of 256, (Z, H, dq_rows, D) in
    _store_dq's order (dq_rows: hopper.bwd_dq_rows, N_q rounded up to its tile), or, VARLEN, (1, 1, BLOCK_M,
    PANEL) blocks of (Z, H, N_q, D) (hopper.bwd_descriptors); lse_ptr, delta_ptr: that
    flat base-2 lse and delta (VARLEN reads them through these). HAS_SEQ_LENS, VARLEN: seq_lens_ptr and cu_k_ptr
    as semantics._sequence takes them; packed sequences are the (1, H, T, D) views, a grid slice a sequence."""
    dtype: gl.constexpr = q_desc.dtype
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]  # keys a program: two MMA warpgroups' halves
    FLAT: gl.constexpr = not VARLEN  # dq's tile in its registers' order (_store_dq): tiles start at 64-row bounds
    # k and v in registers (hopper.BWD_TILES), but with softcap, whose D64 window build then spilled 24 B (offline)
    KV_IN: gl.constexpr = KV_REGS and not SOFTCAP
    gl.static_assert(not (STATS_ACC and SOFTCAP), "softcap's scores need the raw dot (hopper.bwd_meta)")
    BY_ROW: gl.constexpr = not WINDOW  # _next_step's order: every program's band ends at the same row
    # each step's dq tile handed to the writer once the next step's s^T and dp^T are issued, so that the proxy
    # fence's wait falls under them, where a warpgroup has two dq buffers (D64's 64-row tile): 1.012-1.022x on three
    # D64 causal cells; with one buffer the next store then waits longer for the writer, 0.980-0.995x at D128
    # (H200, bench/results/onepass_backward_h200.jsonl, runs "bwd dq late")
    DQ_LATE: gl.constexpr = DQ_BUFS > 1
    pid_n, off_hp, off_z = _tile(head_group, DEAL=CAUSAL, REVERSE=False)
    off_hk = off_hp // parts
    heads = kv_group // parts
    head0 = off_hk * kv_group + (off_hp - off_hk * parts) * heads
    start_n = pid_n * BLOCK_N
    q_start, k_start, q_len, kv_len, causal_offset = _sequence(seq_lens_ptr, cu_k_ptr, off_z, seq_len_q, seq_len_k,
                                                               HAS_SEQ_LENS=HAS_SEQ_LENS, VARLEN=VARLEN)
    if VARLEN:  # the tensors' one batch slice; a program stores only its own sequence's keys
        z_in = 0 * off_z
        key_rows = kv_len
    else:
        z_in = off_z
        key_rows = seq_len_k
    lo, mid, full_end, hi = _query_band(start_n, q_len, kv_len, causal_offset, win_left, win_right,
                                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, WINDOW=WINDOW)
    n_blk = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_M)
    total = n_blk * heads

    k_s = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_s = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    ds_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
    if FLAT:  # DQ_BUFS buffers a warpgroup
        DQ_BARS: gl.constexpr = 2 * DQ_BUFS
        dq_bufs = gl.allocate_shared_memory(gl.float32, [2 * DQ_BUFS, (BLOCK_M // 64) * dq_desc.block_type.shape[0],
                                                         256], dq_desc.layout)
    else:  # DQ_BUFS tiles of HEAD_DIM // PANEL panels
        DQ_BARS: gl.constexpr = DQ_BUFS
        PANEL: gl.constexpr = dq_desc.block_type.shape[3]  # dq's columns a TMA reduce (hopper.BWD_DQ_PANEL)
        dq_bufs = gl.allocate_shared_memory(gl.float32, [DQ_BUFS * (HEAD_DIM // PANEL)] + dq_desc.block_type.shape,
                                            dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_BARS, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_BARS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
    for i in gl.static_range(DQ_BARS):
        mbarrier.init(dq_full.index(i), count=1 if FLAT else 2)
        mbarrier.init(dq_empty.index(i), count=1)
    gl.warp_specialize([
        (_mma, (k_s, v_s, kv_bar, q_bufs, do_bufs, lse_bufs, delta_bufs, ready, empty, ds_bufs, ds_ready, dq_bufs,
                dq_full, dq_empty, dk_ptr, dv_ptr, stride_dkz, stride_dkh, stride_dkn, stride_dkd, stride_dvz,
                stride_dvh, stride_dvn, stride_dvd, total, n_blk, lo, mid, full_end, z_in, k_start, off_hp, start_n,
                q_len, kv_len, key_rows, causal_offset, qk_scale, scale, head0, heads, win_left, win_right, cap2,
                CAUSAL, WINDOW, SOFTCAP, HEAD_DIM, BLOCK_M, 0, FLAT, KV_IN, BY_ROW, STATS_ACC, DQ_LATE)),
        (_mma, (k_s, v_s, kv_bar, q_bufs, do_bufs, lse_bufs, delta_bufs, ready, empty, ds_bufs, ds_ready, dq_bufs,
                dq_full, dq_empty, dk_ptr, dv_ptr, stride_dkz, stride_dkh, stride_dkn, stride_dkd, stride_dvz,
                stride_dvh, stride_dvn, stride_dvd, total, n_blk, lo, mid, full_end, z_in, k_start, off_hp, start_n,
                q_len, kv_len, key_rows, causal_offset, qk_scale, scale, head0, heads, win_left, win_right, cap2,
                CAUSAL, WINDOW, SOFTCAP, HEAD_DIM, BLOCK_M, 1, FLAT, KV_IN, BY_ROW, STATS_ACC, DQ_LATE)),
        (_loader, (k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, lse_ptr, delta_ptr, k_s, v_s, kv_bar,
                   q_bufs, do_bufs, lse_bufs, delta_bufs, ready, empty, total, n_blk, lo, off_z, z_in, q_start,
                   k_start, q_len, off_hk, start_n, head0, heads, num_heads, stat_stride, VARLEN, BLOCK_M, BY_ROW,
                   STATS_ACC)),
        (_writer, (dq_desc, dq_bufs, dq_full, dq_empty, total, n_blk, lo, z_in, q_start, head0, heads, num_heads,
                   dq_rows, HEAD_DIM, BLOCK_M, FLAT, BY_ROW)),
    ], [4, 1, 1], [MMA_REGS, SIDE_REGS, SIDE_REGS])
