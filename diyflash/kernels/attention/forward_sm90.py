"""The Hopper (sm_90) forward: a warp-specialized Gluon kernel in the manner of FlashAttention-3.

A tile is 64 query rows per consumer warpgroup (two, or three for D64: hopper.TILES) of one (batch, head);
the kernel is persistent: a program per SM takes tiles in turns (_tile_at's order). The partitions run side
by side:
- a loader warp fetches each tile's query rows into one of two query slots a consumer (tiles alternate), then
  streams its key and value blocks through TMA into STAGES shared-memory slots (an mbarrier pair per slot
  and tensor: ready when its copy lands, empty when every consumer is done with it), so the next tile's
  rows and first blocks arrive while the consumers still finish the one before;
- the consumer warpgroups (64 rows each, 240 registers a thread for two, 160 for three) run the online
  softmax with asynchronous wgmma: block j's q.k^T is issued before block j-1's p @ v and waited for first,
  so the softmax of block j runs while the tensor cores still work on p @ v (FA3's intra-warpgroup overlap).
  A finished tile's rows wait in registers until the next tile's first q.k^T is issued; then the consumer
  puts them into the query slot they came in by and hands them to the TMA unit, under that matmul
  (1.019-1.028x the kernel that stored them before the next tile began, on four of six D128 cells, H200,
  bench/results/attention_sm90.jsonl, run "held rows"). Without masks, where the tiles leave the last round
  part full, that round comes in runs of key blocks, one a program, and a second launch merges each tile's
  pieces (hopper.split). Where hopper.TILES says (head_dim 64 without causal
  or window masks), the consumers issue each block's pair of matmuls in turns, a ring of named barriers
  (FA3's ping-pong), so that one's softmax runs under the others' matmuls: 1.026-1.061x on five such cells,
  0.97-1.00x on the causal and head_dim-128 ones (runs "consumers in turns, first look" and "consumers in
  turns at D64").
The semantics are semantics.py's (_band, _scores, _visible, _online_softmax, _normalize), the tile order
tile_order.py's (_tile_at, _work), called from Gluon as from the portable kernels. hopper.py decides where this
kernel runs and launches it; this module is imported only where Triton has Gluon's Hopper API
(hopper.kernel_module)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .semantics import (_band, _fma_marked, _inv, _normalize, _online_softmax, _online_softmax_fma, _prescaled,
                        _scores, _visible)
from .tile_order import _piece_keys, _tile_at, _work, _work_turns

# TMA loads and stores: Triton 3.6 names them async_copy_global_to_shared and async_copy_shared_to_global,
# later versions async_load and async_store
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
# a barrier of the calling warps (a partition's own, inside warp_specialize): thread_barrier in 3.6, barrier later
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

LOADER_REGS = gl.constexpr(24)  # the loader's registers a thread (setmaxnreg): the rest go to the consumers
# the consumers' turn barriers (TURNS): hardware named barriers TURN_BARRIER + consumer; the partitions' own
# barriers (thread_barrier) take the lowest ids (tests/test_hopper.py checks the builds' ids stay below)
TURN_BARRIER = gl.constexpr(8)


@gluon.jit
def _wait_turn(WHICH: gl.constexpr, TURNS: gl.constexpr):
    """With TURNS, wait until consumer WHICH may issue its matmuls: its named barrier completes once its own 128
    threads are in and the consumer before it in the ring has handed over (_pass_turn: 128 arrivals). Gluon
    has no named-barrier op: bar.sync by inline PTX (kept in order: it has side effects)."""
    if TURNS:
        gl.inline_asm_elementwise("bar.sync $1, 256; mov.b32 $0, 0;", "=r,r", [TURN_BARRIER + WHICH],
                                  dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pass_turn(WHICH: gl.constexpr, CONSUMERS: gl.constexpr, TURNS: gl.constexpr):
    """With TURNS, hand the turn to the next consumer of the ring (bar.arrive on its barrier, no wait)."""
    if TURNS:
        gl.inline_asm_elementwise("bar.arrive $1, 256; mov.b32 $0, 0;", "=r,r",
                                  [TURN_BARRIER + (WHICH + 1) % CONSUMERS], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
            seq_len_q, seq_len_k, causal_offset, win_left, win_right, num_tiles, num_heads, num_bh, head_group,
            kv_group, split_blocks, max_pieces, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
            WINDOW: gl.constexpr, EVEN_N: gl.constexpr):
    """The loader partition: for each of the program's tiles (_work's order), the consumers' query rows into
    the tile's query slots (tile n's: n % 2) once the consumers have stored tile n - 2's rows out of them,
    then the key and value blocks of _band (a piece's of them: _piece_keys) into the slots, in the consumers'
    order (i counts the blocks over every tile: slot and phase)."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    CONSUMERS: gl.constexpr = q_bufs.shape[0] // 2
    SUB_M: gl.constexpr = BLOCK_M // CONSUMERS
    SPLIT: gl.constexpr = not (CAUSAL or WINDOW)
    blocks = gl.cdiv(seq_len_k, BLOCK_N)
    i = 0
    n = 0
    for t in range(_work_turns(num_tiles, num_bh, head_group, split_blocks, DEAL=CAUSAL, SPLIT=SPLIT)):
        lin, live, first, end, _piece = _work(t, num_tiles, num_bh, head_group, blocks, split_blocks, max_pieces,
                                              DEAL=CAUSAL, SPLIT=SPLIT)
        if live:
            pid_m, off_h, off_z = _tile_at(lin, num_tiles, num_heads, num_bh, head_group, DEAL=CAUSAL,
                                           REVERSE=CAUSAL)
            start_m = pid_m * BLOCK_M
            lo, _fl, _fh, hi = _band(start_m, seq_len_q, seq_len_k, causal_offset, win_left, win_right,
                                     BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, HAS_SEQ_LENS=False,
                                     EVEN_N=EVEN_N, WINDOW=WINDOW)
            if SPLIT:
                lo, hi = _piece_keys(lo, hi, first, end, BLOCK_N=BLOCK_N)
            off_hk = off_h // kv_group
            a = n % 2  # the tile's query slots: the consumers store the tile before's rows from the others
            mbarrier.wait(q_empty.index(a), ((n // 2) & 1) ^ 1)
            mbarrier.expect(q_ready.index(a), CONSUMERS * q_desc.block_type.nbytes)
            for c in gl.static_range(CONSUMERS):
                _tma_load(q_desc, [off_z, off_h, start_m + c * SUB_M, 0], q_ready.index(a),
                          q_bufs.index(a * CONSUMERS + c))
            for start_n in range(lo, hi, BLOCK_N):
                s = i % STAGES
                ph = (i // STAGES) & 1
                mbarrier.wait(k_empty.index(s), ph ^ 1)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
                _tma_load(k_desc, [off_z, off_hk, start_n, 0], k_ready.index(s), k_bufs.index(s))
                mbarrier.wait(v_empty.index(s), ph ^ 1)
                mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
                _tma_load(v_desc, [off_z, off_hk, start_n, 0], v_ready.index(s), v_bufs.index(s))
                i += 1
            n += 1


@gluon.jit
def _block_scores(qk, start_n, offs_m, offs_n, causal_offset, qk_scale, cap2, inv_cap2, SOFTCAP: gl.constexpr,
                  FMA: gl.constexpr):
    """Key block start_n's scores as _block_softmax takes them, from its raw q.k^T tile (forward.py's loop body,
    same helpers): with FMA the raw tile (the scale goes into exp2's argument), else _scores'."""
    if FMA:
        x = qk
    else:
        x, _ = _scores(qk, offs_m[:, None], (start_n + offs_n)[None, :], causal_offset, qk_scale, cap2, inv_cap2,
                       0.0, SOFTCAP=SOFTCAP, ALIBI=False)
    return x


@gluon.jit
def _block_mask(x, start_n, offs_m, offs_n, kv_len, causal_offset, win_left, win_right, CAUSAL: gl.constexpr,
                WINDOW: gl.constexpr, KEY_MASK: gl.constexpr):
    """_block_scores' x with -inf where a key is not visible (_visible)."""
    vis = _visible(offs_m[:, None], (start_n + offs_n)[None, :], kv_len, causal_offset, win_left, win_right,
                   KEY_MASK=KEY_MASK, CAUSAL=CAUSAL, WINDOW=WINDOW)
    return gl.where(vis, x, float("-inf"))


@gluon.jit
def _block_softmax(x, m_i, l_i, top, qk_scale, MASKED: gl.constexpr, FMA: gl.constexpr):
    """One key block of the online softmax from its scores x (_block_scores, _block_mask): (p, alpha, m_new,
    l_new, top). FMA: _online_softmax_fma (top keeps each row's largest |max|); MASKED: a row with no visible
    key yet gets p = 0."""
    if FMA:
        p, alpha, m_new, l_new, reach = _online_softmax_fma(x, m_i, l_i, qk_scale, MASKED=MASKED)
        top = gl.maximum(top, reach)
    else:
        p, alpha, _grew, m_new, l_new = _online_softmax(x, m_i, l_i, MASKED=MASKED, LAZY=False)
    return p, alpha, m_new, l_new, top


@gluon.jit
def _softmax_block(qk, m_i, l_i, top, start_n, full_lo, full_hi, offs_m, offs_n, kv_len, causal_offset, qk_scale,
                   win_left, win_right, cap2, inv_cap2, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                   WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, KEY_MASK: gl.constexpr, FMA: gl.constexpr,
                   SERIAL: gl.constexpr):
    """Block start_n's softmax in one loop over all of _band's ranges: with MASKED (some block may need masks),
    masked only outside [full_lo, full_hi), both softmaxes behind the block's branch. One loop keeps the pipeline
    full across the ranges: the causal D128 cells ran 0.90-0.96x -> 0.96-1.03x cuDNN (H200,
    bench/results/attention_sm90.jsonl). SERIAL (with MASKED): only the mask behind the branch, the softmax
    after it for every block with MASKED's guard, so that the softmax, the rescale and p's conversion that
    follow are one basic block for ptxas to schedule (where the branch holds two softmaxes, the compiler moves
    the conversion past their join)."""
    x = _block_scores(qk, start_n, offs_m, offs_n, causal_offset, qk_scale, cap2, inv_cap2, SOFTCAP=SOFTCAP, FMA=FMA)
    if MASKED and SERIAL:
        if (start_n < full_lo) | (start_n >= full_hi):
            x = _block_mask(x, start_n, offs_m, offs_n, kv_len, causal_offset, win_left, win_right, CAUSAL=CAUSAL,
                            WINDOW=WINDOW, KEY_MASK=KEY_MASK)
        p, alpha, m_new, l_new, top = _block_softmax(x, m_i, l_i, top, qk_scale, MASKED=True, FMA=FMA)
    elif MASKED:
        if (start_n < full_lo) | (start_n >= full_hi):
            x = _block_mask(x, start_n, offs_m, offs_n, kv_len, causal_offset, win_left, win_right, CAUSAL=CAUSAL,
                            WINDOW=WINDOW, KEY_MASK=KEY_MASK)
            p, alpha, m_new, l_new, top = _block_softmax(x, m_i, l_i, top, qk_scale, MASKED=True, FMA=FMA)
        else:
            p, alpha, m_new, l_new, top = _block_softmax(x, m_i, l_i, top, qk_scale, MASKED=False, FMA=FMA)
    else:
        p, alpha, m_new, l_new, top = _block_softmax(x, m_i, l_i, top, qk_scale, MASKED=False, FMA=FMA)
    return p, alpha, m_new, l_new, top


@gluon.jit
def _fresh_rows(SUB_M: gl.constexpr, HEAD_DIM_V: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """A tile's starting state: (acc, m_i, l_i, top) of rows that have seen no key."""
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    return (gl.zeros([SUB_M, HEAD_DIM_V], gl.float32, o_layout), gl.full([SUB_M], float("-inf"), gl.float32, row_s),
            gl.zeros([SUB_M], gl.float32, row_s), gl.zeros([SUB_M], gl.float32, row_s))


@gluon.jit
def _first_qk(q, k_bufs, k_ready, i, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, WHICH: gl.constexpr,
              CONSUMERS: gl.constexpr, TURNS: gl.constexpr):
    """A tile's first q.k^T issued in the consumer's turn (asynchronous, not waited for: _consume waits), block
    i's slot."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    SUB_M: gl.constexpr = q.shape[0]
    mbarrier.wait(k_ready.index(i % STAGES), (i // STAGES) & 1)
    k = k_bufs.index(i % STAGES).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    _wait_turn(WHICH, TURNS=TURNS)
    qk = warpgroup_mma(q, k, gl.zeros([SUB_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
    _pass_turn(WHICH, CONSUMERS, TURNS=TURNS)
    return qk, k


@gluon.jit
def _consume(q, qk, k, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, i, lo, hi, full_lo, full_hi, offs_m,
             offs_n, kv_len, causal_offset, qk_scale, win_left, win_right, cap2, inv_cap2,
             BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr,
             MASKED: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
             KEY_MASK: gl.constexpr, FMA: gl.constexpr, WHICH: gl.constexpr, CONSUMERS: gl.constexpr,
             TURNS: gl.constexpr, SERIAL: gl.constexpr):
    """A tile's key blocks [lo, hi) (lo < hi) of a consumer's rows, the first block's q.k^T issued by _first_qk
    (qk, k): the rows' (acc, m_i, l_i, top), and i (it counts the blocks of the program's tiles so far: slot and
    phase) past this tile's. Block j's q.k^T is issued before block j-1's p @ v and waited for alone (wait(1)),
    so the softmax of block j overlaps that p @ v; the last p @ v is finished before returning. With TURNS
    the pair is issued in the consumer's turn (_wait_turn, _pass_turn: FA3's ping-pong), so that the
    consumers' softmaxes fall under each other's matmuls. SERIAL: the pair is waited for together, the softmax
    after both (in _softmax_block's SERIAL form), so that it runs under the other consumers' matmuls only: with
    three consumers on causal D64, 1.023x -> 1.063x cuDNN, but 0.90-1.00x against 1.05-1.10x on every D128
    cell (H200, bench/results/attention_sm90.jsonl, run "the softmax outside p @ v's wait"); hopper.Tiles.serial
    says where."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM_V, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    SUB_M: gl.constexpr = q.shape[0]
    zero_s = gl.zeros([SUB_M, BLOCK_N], gl.float32, s_layout)
    acc, m_i, l_i, top = _fresh_rows(SUB_M, HEAD_DIM_V, s_layout, o_layout)
    s_idx = i % STAGES
    ph = (i // STAGES) & 1
    qk, _q0, _k0 = warpgroup_mma_wait(0, deps=(qk, q, k))
    mbarrier.arrive(k_empty.index(s_idx), count=1)
    p, alpha, m_i, l_i, top = _softmax_block(qk, m_i, l_i, top, lo, full_lo, full_hi, offs_m, offs_n, kv_len,
                                             causal_offset, qk_scale, win_left, win_right, cap2, inv_cap2,
                                             MASKED=MASKED, CAUSAL=CAUSAL, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
                                             KEY_MASK=KEY_MASK, FMA=FMA, SERIAL=SERIAL)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p16 = gl.convert_layout(p.to(v_bufs.dtype), p_layout)
    prev = s_idx
    prev_ph = ph
    i += 1
    for start_n in range(lo + BLOCK_N, hi, BLOCK_N):
        s_idx = i % STAGES
        ph = (i // STAGES) & 1
        mbarrier.wait(k_ready.index(s_idx), ph)
        k = k_bufs.index(s_idx).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        mbarrier.wait(v_ready.index(prev), prev_ph)
        v = v_bufs.index(prev).reshape([BLOCK_N, HEAD_DIM_V])
        _wait_turn(WHICH, TURNS=TURNS)
        qk = warpgroup_mma(q, k, zero_s, use_acc=False, is_async=True)
        acc = warpgroup_mma(p16, v, acc, is_async=True)
        _pass_turn(WHICH, CONSUMERS, TURNS=TURNS)
        if SERIAL:
            qk, acc, _q1, _k1, _v1, _p1 = warpgroup_mma_wait(0, deps=(qk, acc, q, k, v, p16))
        else:
            qk, _q1, _k1 = warpgroup_mma_wait(1, deps=(qk, q, k))
        mbarrier.arrive(k_empty.index(s_idx), count=1)
        if SERIAL:
            mbarrier.arrive(v_empty.index(prev), count=1)
        p, alpha, m_i, l_i, top = _softmax_block(qk, m_i, l_i, top, start_n, full_lo, full_hi, offs_m, offs_n,
                                                 kv_len, causal_offset, qk_scale, win_left, win_right, cap2,
                                                 inv_cap2, MASKED=MASKED, CAUSAL=CAUSAL, WINDOW=WINDOW,
                                                 SOFTCAP=SOFTCAP, KEY_MASK=KEY_MASK, FMA=FMA, SERIAL=SERIAL)
        if not SERIAL:
            acc, _v1, _p1 = warpgroup_mma_wait(0, deps=(acc, v, p16))
            mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(v_bufs.dtype), p_layout)
        prev = s_idx
        prev_ph = ph
        i += 1
    mbarrier.wait(v_ready.index(prev), prev_ph)
    v = v_bufs.index(prev).reshape([BLOCK_N, HEAD_DIM_V])
    acc = warpgroup_mma(p16, v, acc, is_async=True)
    acc, _v2, _p2 = warpgroup_mma_wait(0, deps=(acc, v, p16))
    mbarrier.arrive(v_empty.index(prev), count=1)
    return acc, m_i, l_i, top, i


@gluon.jit
def _pass_blocks(k_ready, k_empty, v_ready, v_empty, i, n, WHICH: gl.constexpr, CONSUMERS: gl.constexpr,
                 TURNS: gl.constexpr):
    """n key blocks of the tile's band that a consumer's rows do not see: each waited for and released
    as if read, so that every slot's count and phase keep the loader's order, and with TURNS its turn taken
    and passed on, so that every consumer takes as many turns a tile (the loader's blocks); returns i past
    them. (Arriving only once a block has landed: the loader refills a slot only after every consumer
    released its use before.)"""
    STAGES: gl.constexpr = k_ready.shape[0]
    for _j in range(n):
        s_idx = i % STAGES
        ph = (i // STAGES) & 1
        mbarrier.wait(k_ready.index(s_idx), ph)
        mbarrier.arrive(k_empty.index(s_idx), count=1)
        mbarrier.wait(v_ready.index(s_idx), ph)
        mbarrier.arrive(v_empty.index(s_idx), count=1)
        _wait_turn(WHICH, TURNS=TURNS)
        _pass_turn(WHICH, CONSUMERS, TURNS=TURNS)
        i += 1
    return i


@gluon.jit
def _store_piece(out, lse, piece, part_row, part_o_ptr, part_lse_ptr, BLOCK_M: gl.constexpr):
    """A piece's rows (_work; piece >= 0, else nothing) in fp32 at row part_row of its slot of the merge's
    buffers: part_o (pieces, BLOCK_M, D_v), part_lse (pieces, BLOCK_M)."""
    row_o: gl.constexpr = gl.SliceLayout(1, out.type.layout)
    DV: gl.constexpr = out.shape[1]
    rows = part_row + gl.arange(0, out.shape[0], layout=row_o)
    cols = gl.arange(0, DV, layout=gl.SliceLayout(0, out.type.layout))
    at = piece.to(gl.int64) * BLOCK_M + rows
    mine = (rows * 0 + piece) >= 0  # a whole tile (piece -1) stores nothing here
    gl.store(part_o_ptr + at[:, None] * DV + cols[None, :], out, mask=mine[:, None])
    gl.store(part_lse_ptr + at, lse, mask=mine)


@gluon.jit
def _store_rows(acc, m_i, l_i, top, row0, off_h, off_z, o_desc, o_buf, q_empty, lse_ptr, stride_lz, stride_lh,
                seq_len_q, piece, part_row, part_o_ptr, part_lse_ptr, FMA: gl.constexpr, BLOCK_M: gl.constexpr,
                SPLIT: gl.constexpr):
    """A finished tile's rows row0 onward of head (off_z, off_h): out (_normalize) into o_buf, the query slot
    the tile read (no q.k^T reads it any more), handed to the TMA unit (rows past N clipped by the
    descriptor), lse by pointer; the slot goes back to the loader (q_empty) once the copy has read it.
    A piece of a tile (SPLIT, piece >= 0: _work) goes to the merge's buffers too (_store_piece)."""
    row_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    m_o = gl.convert_layout(m_i, row_o)
    l_o = gl.convert_layout(l_i, row_o)
    out, lse = _normalize(acc, m_o, l_o, l_o > 0)
    if FMA:
        lse = _fma_marked(lse, gl.convert_layout(top, row_o))
    if SPLIT:  # (masked, not branched: a branch here made Triton 3.6's ptxas wait for the next tile's first
        # q.k^T before the held rows' first use, C7517; a piece's rows also go to out, which the merge overwrites)
        _store_piece(out, lse, piece, part_row, part_o_ptr, part_lse_ptr, BLOCK_M=BLOCK_M)
    _store_tile(out, lse, row0, off_h, off_z, o_desc, o_buf, q_empty, lse_ptr, stride_lz, stride_lh, seq_len_q)


@gluon.jit
def _store_tile(out, lse, row0, off_h, off_z, o_desc, o_buf, q_empty, lse_ptr, stride_lz, stride_lh, seq_len_q):
    """_store_rows' rows through the TMA unit."""
    SUB_M: gl.constexpr = out.shape[0]
    row_o: gl.constexpr = gl.SliceLayout(1, out.type.layout)
    o_buf.reshape([SUB_M, out.shape[1]]).store(out.to(o_desc.dtype))
    fence_async_shared()
    _barrier()  # every row in before the copy reads them
    _tma_store(o_desc, [off_z, off_h, row0, 0], o_buf)
    rows = row0 + gl.arange(0, SUB_M, layout=row_o)
    l_off = off_z.to(gl.int64) * stride_lz + off_h.to(gl.int64) * stride_lh
    gl.store(lse_ptr + l_off + rows, lse, mask=rows < seq_len_q)
    tma.store_wait(0)
    _barrier()  # the copy has read the slot (the issuing thread waited) before the loader may refill it
    mbarrier.arrive(q_empty, count=1)


@gluon.jit
def _consumer(q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, o_desc,
              lse_ptr, stride_lz, stride_lh, seq_len_q, seq_len_k, causal_offset, qk_scale, num_tiles, num_heads,
              num_bh, head_group, win_left, win_right, cap2, split_blocks, max_pieces, part_o_ptr, part_lse_ptr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr,
              CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, EVEN_N: gl.constexpr,
              PASS: gl.constexpr, FMA: gl.constexpr, TURNS: gl.constexpr, SERIAL: gl.constexpr,
              WHICH: gl.constexpr):
    """A consumer partition: for each of the program's tiles, rows start_m + WHICH * SUB_M onward over the key
    blocks of their own _band (masks where forward.py has them); the loader streams the tile's band, whose other
    blocks this consumer passes (_pass_blocks: at D64 and causal 1.02-1.04x on three of four cells, H200,
    bench/results/attention_sm90.jsonl, run "own band"). A tile's rows are stored (_store_rows) once the next
    tile's first q.k^T is issued, so the tensor cores work through the epilogue; the query slots alternate by
    tile, and each tile's rows go out through the slot its queries came in by. FMA: the softmax in
    _online_softmax_fma's form, and a row that reached FMA_MAX_ROW gets a NaN lse (_fma_marked), which the
    portable kernel's second pass takes as its mark to compute the row's block again in the exact form.
    Without causal or window masks (SPLIT), the last round of tiles may come in pieces (_work: split_blocks > 0),
    whose rows go to part_o_ptr / part_lse_ptr for the merge launch (merge.py)."""
    CONSUMERS: gl.constexpr = q_bufs.shape[0] // 2
    SPLIT: gl.constexpr = not (CAUSAL or WINDOW)
    blocks = gl.cdiv(seq_len_k, BLOCK_N)
    SUB_M: gl.constexpr = BLOCK_M // CONSUMERS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM_V, 16])
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    inv_cap2 = _inv(cap2, SOFTCAP=SOFTCAP)
    i = 0
    n = 0
    if WHICH == CONSUMERS - 1:
        _pass_turn(WHICH, CONSUMERS, TURNS=TURNS)  # consumer 0 takes the first turn
    # the tile before's rows, stored under this tile's first q.k^T (held: whether there is one)
    held = 0
    acc, m_i, l_i, top = _fresh_rows(SUB_M, HEAD_DIM_V, s_layout, o_layout)
    held_row0 = 0
    held_h = 0
    held_z = 0
    held_piece = -1
    for t in range(_work_turns(num_tiles, num_bh, head_group, split_blocks, DEAL=CAUSAL, SPLIT=SPLIT)):
        lin, live, first, end, piece = _work(t, num_tiles, num_bh, head_group, blocks, split_blocks, max_pieces,
                                             DEAL=CAUSAL, SPLIT=SPLIT)
        if live:
            pid_m, off_h, off_z = _tile_at(lin, num_tiles, num_heads, num_bh, head_group, DEAL=CAUSAL,
                                           REVERSE=CAUSAL)
            start_m = pid_m * BLOCK_M
            tile_lo, _fl, _fh, tile_hi = _band(start_m, seq_len_q, seq_len_k, causal_offset, win_left, win_right,
                                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, HAS_SEQ_LENS=False,
                                               EVEN_N=EVEN_N, WINDOW=WINDOW)
            n_tile = gl.cdiv(gl.maximum(tile_hi - tile_lo, 0), BLOCK_N)  # the loader's blocks of the tile
            row0 = start_m + WHICH * SUB_M
            offs_m = row0 + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, s_layout))
            a = n % 2
            q = q_bufs.index(a * CONSUMERS + WHICH).reshape([SUB_M, HEAD_DIM])
            held_buf = q_bufs.index((1 - a) * CONSUMERS + WHICH)  # the tile before's slot: its rows go out by it
            mbarrier.wait(q_ready.index(a), (n // 2) & 1)
            score_scale = qk_scale
            if PASS == 3:  # q times the power of two of the scale, in place: no raw dot leaves fp32's range
                q_pre, score_scale = _prescaled(q.load(q_layout), qk_scale)
                q.store(q_pre)
                fence_async_shared()
                _barrier()  # the warpgroup's rows are all in before its wgmma reads them
            # the consumer's own rows' blocks (with 192-row tiles over 128-key blocks, a causal tile's first
            # consumers see a block fewer and mask fewer); the tile's others are passed (_pass_blocks)
            lo, full_lo, full_hi, hi = _band(row0, seq_len_q, seq_len_k, causal_offset, win_left, win_right,
                                             BLOCK_M=SUB_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, HAS_SEQ_LENS=False,
                                             EVEN_N=EVEN_N, WINDOW=WINDOW)
            if SPLIT:  # no masks: the consumer's rows see every block the loader streams (a piece's of them)
                lo, hi = _piece_keys(lo, hi, first, end, BLOCK_N=BLOCK_N)
                n_before = 0
                n_after = 0
            else:
                n_before = n_tile
                if lo < hi:
                    n_before = (lo - tile_lo) // BLOCK_N
                n_after = n_tile - n_before - gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)
            i = _pass_blocks(k_ready, k_empty, v_ready, v_empty, i, n_before, WHICH=WHICH, CONSUMERS=CONSUMERS,
                             TURNS=TURNS)
            if lo < hi:
                qk, k = _first_qk(q, k_bufs, k_ready, i, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, WHICH=WHICH,
                                  CONSUMERS=CONSUMERS, TURNS=TURNS)
                if held:
                    _store_rows(acc, m_i, l_i, top, held_row0, held_h, held_z, o_desc, held_buf,
                                q_empty.index(1 - a), lse_ptr, stride_lz, stride_lh, seq_len_q, held_piece,
                                WHICH * SUB_M, part_o_ptr, part_lse_ptr, FMA=FMA, BLOCK_M=BLOCK_M, SPLIT=SPLIT)
                acc, m_i, l_i, top, i = _consume(
                    q, qk, k, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, i, lo, hi, full_lo, full_hi,
                    offs_m, offs_n, seq_len_k, causal_offset, score_scale, win_left, win_right, cap2, inv_cap2,
                    BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, HEAD_DIM_V=HEAD_DIM_V, MASKED=CAUSAL or WINDOW or not EVEN_N,
                    CAUSAL=CAUSAL, WINDOW=WINDOW, SOFTCAP=SOFTCAP, KEY_MASK=not EVEN_N, FMA=FMA, WHICH=WHICH,
                    CONSUMERS=CONSUMERS, TURNS=TURNS, SERIAL=SERIAL)
            else:  # its rows see no key: zeros and lse -inf
                if held:
                    _store_rows(acc, m_i, l_i, top, held_row0, held_h, held_z, o_desc, held_buf,
                                q_empty.index(1 - a), lse_ptr, stride_lz, stride_lh, seq_len_q, held_piece,
                                WHICH * SUB_M, part_o_ptr, part_lse_ptr, FMA=FMA, BLOCK_M=BLOCK_M, SPLIT=SPLIT)
                acc, m_i, l_i, top = _fresh_rows(SUB_M, HEAD_DIM_V, s_layout, o_layout)
            i = _pass_blocks(k_ready, k_empty, v_ready, v_empty, i, n_after, WHICH=WHICH, CONSUMERS=CONSUMERS,
                             TURNS=TURNS)
            held = 1
            held_row0 = row0
            held_h = off_h
            held_z = off_z
            held_piece = piece
            n += 1
    if held:
        _store_rows(acc, m_i, l_i, top, held_row0, held_h, held_z, o_desc,
                    q_bufs.index(((n - 1) % 2) * CONSUMERS + WHICH), q_empty.index((n - 1) % 2), lse_ptr, stride_lz,
                    stride_lh, seq_len_q, held_piece, WHICH * SUB_M, part_o_ptr, part_lse_ptr, FMA=FMA,
                    BLOCK_M=BLOCK_M, SPLIT=SPLIT)


@gluon.jit(do_not_specialize=["num_tiles", "num_bh", "head_group", "split_blocks", "max_pieces"])
def _hopper_fwd_kernel(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, part_o_ptr, part_lse_ptr, stride_lz, stride_lh,
    seq_len_q, seq_len_k, qk_scale, num_tiles, num_heads, num_bh, head_group, kv_group, win_left, win_right, cap2,
    split_blocks, max_pieces,
    # semantics: what is computed
    HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
    SOFTCAP: gl.constexpr, PASS: gl.constexpr, FMA: gl.constexpr,
    # tiles: how
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, EVEN_N: gl.constexpr,
    CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, TURNS: gl.constexpr, SERIAL: gl.constexpr,
):
    """q_desc, k_desc, v_desc, o_desc: host TMA descriptors over the whole (Z, H, N, D) tensors in (1, 1, 64, D)
    and (1, 1, BLOCK_N, D) blocks (hopper.descriptor); lse by pointer and strides. The semantics are the
    portable forward's (forward.py) for causal, WINDOW, SOFTCAP and GQA (kv_group) without seq_lens; PASS 3
    (launch.overflow_passes: where a raw q.k can leave fp32's range) dots q prescaled as forward.py's PASS 3
    does, in one pass; PASS 0 dots it as it is. FMA (not SOFTCAP, qk_scale > 0): the softmax in
    _online_softmax_fma's form, rows past FMA_MAX_ROW marked for the portable second pass (a NaN lse).
    EVEN_N: every key block is full. CONSUMERS (2 or 3) warpgroups of
    BLOCK_M // CONSUMERS rows each, CONSUMER_REGS registers a thread (hopper.TILES). TURNS: the consumers issue
    each block's matmuls in turns, a ring of named barriers (_wait_turn, _pass_turn; every consumer takes a turn
    for every block of the tile's band, those it passes included, so any call may take it: hopper.Tiles.turns
    says where it does). SERIAL: with masks, each block's softmax after both its q.k^T and the p @ v before it
    (_consume; hopper.Tiles.serial says where).
    Persistent: the grid's programs (hopper.schedule) take the num_tiles x num_bh tiles (num_tiles of BLOCK_M
    rows per head, num_bh = batch x num_heads) in turns (_turn: causal tiles, of unequal work, dealt over
    head groups back and forth), so the loader fetches a tile's first blocks while the consumers finish the
    one before. Without causal or window masks, split_blocks > 0 (hopper.split) cuts the last round into runs of
    that many key blocks, one a program (tile_order._work), whose pieces go to part_o_ptr and part_lse_ptr (at
    most max_pieces a tile) for the merge launch (merge.py); split_blocks 0: whole tiles only."""
    causal_offset = seq_len_k - seq_len_q
    # two query slots a consumer, by tile (the tile before's rows go out by its slot: o_desc's blocks are q's)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2 * CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for a in gl.static_range(2):
        mbarrier.init(q_ready.index(a), count=1)
        mbarrier.init(q_empty.index(a), count=CONSUMERS)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=CONSUMERS)
        mbarrier.init(v_empty.index(s), count=CONSUMERS)
    # (the partitions' argument lists are written out: a tuple of them, concatenated, loses the constexprs)
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_consumer, (q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, o_desc,
                         lse_ptr, stride_lz, stride_lh, seq_len_q, seq_len_k, causal_offset, qk_scale,
                         num_tiles, num_heads, num_bh, head_group, win_left, win_right, cap2, split_blocks,
                         max_pieces, part_o_ptr, part_lse_ptr, BLOCK_M, BLOCK_N,
                         HEAD_DIM, HEAD_DIM_V, CAUSAL, WINDOW, SOFTCAP, EVEN_N, PASS, FMA, TURNS, SERIAL, 0)),
            (_consumer, (q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, o_desc,
                         lse_ptr, stride_lz, stride_lh, seq_len_q, seq_len_k, causal_offset, qk_scale,
                         num_tiles, num_heads, num_bh, head_group, win_left, win_right, cap2, split_blocks,
                         max_pieces, part_o_ptr, part_lse_ptr, BLOCK_M, BLOCK_N,
                         HEAD_DIM, HEAD_DIM_V, CAUSAL, WINDOW, SOFTCAP, EVEN_N, PASS, FMA, TURNS, SERIAL, 1)),
            (_consumer, (q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, o_desc,
                         lse_ptr, stride_lz, stride_lh, seq_len_q, seq_len_k, causal_offset, qk_scale,
                         num_tiles, num_heads, num_bh, head_group, win_left, win_right, cap2, split_blocks,
                         max_pieces, part_o_ptr, part_lse_ptr, BLOCK_M, BLOCK_N,
                         HEAD_DIM, HEAD_DIM_V, CAUSAL, WINDOW, SOFTCAP, EVEN_N, PASS, FMA, TURNS, SERIAL, 2)),
            (_loader, (q_desc, k_desc, v_desc, q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                       v_empty, seq_len_q, seq_len_k, causal_offset, win_left, win_right, num_tiles, num_heads,
                       num_bh, head_group, kv_group, split_blocks, max_pieces, BLOCK_M, BLOCK_N, CAUSAL, WINDOW,
                       EVEN_N)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, o_desc,
                         lse_ptr, stride_lz, stride_lh, seq_len_q, seq_len_k, causal_offset, qk_scale,
                         num_tiles, num_heads, num_bh, head_group, win_left, win_right, cap2, split_blocks,
                         max_pieces, part_o_ptr, part_lse_ptr, BLOCK_M, BLOCK_N,
                         HEAD_DIM, HEAD_DIM_V, CAUSAL, WINDOW, SOFTCAP, EVEN_N, PASS, FMA, TURNS, SERIAL, 0)),
            (_consumer, (q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, o_desc,
                         lse_ptr, stride_lz, stride_lh, seq_len_q, seq_len_k, causal_offset, qk_scale,
                         num_tiles, num_heads, num_bh, head_group, win_left, win_right, cap2, split_blocks,
                         max_pieces, part_o_ptr, part_lse_ptr, BLOCK_M, BLOCK_N,
                         HEAD_DIM, HEAD_DIM_V, CAUSAL, WINDOW, SOFTCAP, EVEN_N, PASS, FMA, TURNS, SERIAL, 1)),
            (_loader, (q_desc, k_desc, v_desc, q_bufs, q_ready, q_empty, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                       v_empty, seq_len_q, seq_len_k, causal_offset, win_left, win_right, num_tiles, num_heads,
                       num_bh, head_group, kv_group, split_blocks, max_pieces, BLOCK_M, BLOCK_N, CAUSAL, WINDOW,
                       EVEN_N)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
