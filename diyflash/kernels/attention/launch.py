"""The attention launchers (attention_fwd, attention_bwd): tiles, TMA and offset choices per call, head
groups and splits, and the keys of the plans (plans.py) that replay a call's launches."""

from __future__ import annotations

import functools

import torch

from .._runtime import PLAIN, device_limits, keep, require_triton
from ..contract import LOG2E, Variant, empty_out, few_query_rows, mean_keys, variant
from ..attention_configs import AttnConfig, BwdConfig, bwd_config, fwd_config, head_dim_pad, window_fwd_config

require_triton()  # before anything imports triton: its absence is then the error table's "triton is required"

from .._compile import compile_ahead_on, hash_first  # noqa: E402
from .._launch import DirectLauncher, cdiv, runtime_key  # noqa: E402
from .backward import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel  # noqa: E402
from .backward_rows import (_attn_bwd_dq_convert_kernel, _attn_bwd_group_sum_kernel,  # noqa: E402
                            _attn_bwd_preprocess_kernel)
from . import hopper, kvcache  # noqa: E402  (the decode route; kvcache shares launch_args and plans, not this module)
from .forward import _attn_fwd_kernel  # noqa: E402
from .merge import _attn_merge_pieces_kernel  # noqa: E402
from .launch_args import INTERPRETED, alibi_stride, dot_precision, upcast, v_pad, variant_meta  # noqa: E402
from .lazy import RESCALE_N, VOTE_PACKS  # noqa: E402
from .grids import head_group, head_split  # noqa: E402
from .plans import (HOST_DESC_MIN_WORK, MAX_GRID_Z, aligned, launch_chunks, Launch, layout_key, Plan,  # noqa: E402
                    packed_host_descriptor, replay, scratch_buffers, host_descriptors_ok)
from .views import (Packed, as_4d, heads_of, kernel_strides, rows_fit_int32, stats_3d, stats_shape,  # noqa: E402
                    tma_ok)


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
_BWD_SUM = DirectLauncher(_attn_bwd_group_sum_kernel)
_BWD_DQ_CONVERT = DirectLauncher(_attn_bwd_dq_convert_kernel)
_MERGE = DirectLauncher(_attn_merge_pieces_kernel)
assert INTERPRETED == _FWD.interpreted  # launch_args decides it as Triton decorated these kernels


_LAUNCHERS = (_FWD, _BWD_PRE, _BWD_DKDV, _BWD_DQ, _BWD_SUM, _BWD_DQ_CONVERT, _MERGE)


def _attention_kernels() -> list:
    """Every attention kernel, in one order (_compile.hash_first: the kernels share semantics.py's helpers); none
    under the interpreter (nothing compiles)."""
    if INTERPRETED:
        return []
    hoppers = ((hopper.kernel_module(), "_hopper_fwd_kernel"), (hopper.backward_module(), "_hopper_bwd_kernel"))
    return [*(lc.kernel for lc in (*_LAUNCHERS, *kvcache.LAUNCHERS)),
            *(getattr(module, name) for module, name in hoppers if not isinstance(module, str))]


hash_first(_attention_kernels)

PLANS: dict[tuple, Plan] = {}  # the dense calls' plans (plans.py), by plan_key


keep("attention plans", lambda: (PLANS,))
keep("attention bound kernels",
     lambda: [lc._compiled for lc in (*_LAUNCHERS, *hopper.LAUNCHERS.values())])


def plan_key(kind: str, inputs: tuple, variant: Variant, scale: float,
              overrides: tuple = (None, None)) -> tuple | None:
    """The key of a call's plan, or None where there is no plan: under the interpreter (no compiled
    kernels) and for batches that need more than one grid (MAX_GRID_Z). `overrides`: the call's
    explicit (config, group), so that a benchmark of given tiles replays a plan as users' calls do and
    times the kernels, not the host path that picks tiles. (kvcache.py keys its plans on classes of the
    caches' lengths instead: kvcache._kv_key.)"""
    if PLAIN or INTERPRETED or not inputs[0].is_cuda or inputs[0].shape[0] > MAX_GRID_Z:
        return None
    return (kind, variant, scale, inputs[0].device, torch.cuda.current_device(), *runtime_key(), *map(layout_key, inputs),
            *overrides)


def _z_chunks(z: int, env: dict) -> list[tuple[int, dict]]:
    """CUDA caps a grid's z dimension at 65535: launch larger batches in slices along dim 0 (views,
    no copy). Returns [(z_count, tensors by name, sliced), ...]; a single chunk keeps the tensors."""
    if z <= MAX_GRID_Z:
        return [(z, env)]
    return [(min(z, z0 + MAX_GRID_Z) - z0,
             {name: t[z0:z0 + MAX_GRID_Z] if _per_batch(name, t) else t for name, t in env.items()})
            for z0 in range(0, z, MAX_GRID_Z)]


def _per_batch(name: str, t: torch.Tensor | None) -> bool:
    # per-head tensors (sinks (H,), ALiBi slopes (H,)) are the same for every slice of the batch
    return t is not None and not (name in ("sinks", "alibi") and t.dim() == 1)


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
    if rows not in VOTE_PACKS or per_thread % RESCALE_N:
        return 0
    return rows


def overflow_passes(dtype: torch.dtype, work: int | None) -> tuple[int, ...]:
    """The forward's passes (its PASS): (1, 2) where a raw q.k can leave fp32's range (bf16, fp32 inputs
    of ~1e19), else (0,): fp16 products are below 65504^2 = 4.3e9, so no dot of them comes near 3.4e38.
    The first pass dots q as it is and marks a block whose dot overflowed; the second runs only the marked
    blocks again, on q times the power of two of the scale (semantics._prescaled), and costs the others a
    load and a return. Prescaling q in every block instead kept it out of shared memory for the dots:
    the bf16 D128 causal forward fell from 532 to 342 TFLOPS at N16384 (H200). A call with less work than
    PRESCALED_MAX_WORK (`work`: Z*H*N_q*N_k*padded head_dim) runs that one prescaled pass (3): its second launch
    cost more host time than the prescaled dots cost its GPU time. work=None: the one prescaled pass whatever
    the size (the Hopper kernel, whose q sits in shared memory, prescaled there once a tile)."""
    if dtype == torch.float16:
        return (0,)  # the same rule keeps fp16 raw in semantics._prescaled
    return (3,) if work is None or work < PRESCALED_MAX_WORK else (1, 2)


# bench/results/overhead_h200.jsonl (table "prescaled", H200): at 2^26-2^28 the one prescaled pass took -2.0 to
# +2.8 us of GPU time against the two passes and saved 3-9 us of host time a call; at 2^30 without causal its
# GPU time was 27 % longer (30.8 against 24.2 us).
PRESCALED_MAX_WORK = 1 << 29


# The second pass's programs mostly load their rows' lse and return: 4 warps, one pipeline stage, no warp
# specialization or lazy rescaling keep its shared memory and setup small (more programs resident, less
# work before the return); the rare block it runs again is slower for it. A program checks MARKED_PASS_ROWS
# rows (a power of two, a multiple of every block_m) and runs their marked blocks one after the other: as a
# program a 64-row block, the pass after the Hopper forward took 32 of a GQA 32/8 D128 causal bf16 B4 N4096
# call's 880 us (8192 programs, two an SM at 191 registers), with 2048 rows 2.4 us (H200,
# bench/results/fwd_marked_pass_h200.txt).
MARKED_PASS_ROWS = 2048
_RESCUE_META = dict(num_warps=4, num_stages=1, WS=False, LAZY=False, VOTE_ROWS=0)
# The second pass after the Hopper forward (semantics._fma_marked) mostly reads its rows' lse and returns: small
# tiles, whose build is short (64 x 32: 1.1-1.5 s against 4.2 s for 128 x 128; results/marked_pass_compile_sm90.txt)
MARKED_PASS_TILES = AttnConfig(64, 32, 4, 1)
MERGE_ROWS = 32  # rows a program of the split forward's merge (merge.py): 32 x 128 fp32 of each piece at once


def decode_route(q, k, seq_lens, packed, config, group) -> bool:
    """Whether attention_fwd runs the decode kernel: 4-D q and k (no seq_lens, not packed, no tiles asked
    for) whose N_q query rows times the GQA group fit one decode tile. There the forward kernel would run
    one mostly empty row tile per q head, each reading its kv head's keys again without splitting them
    (bench.decode, H200, N_q = 1: 2-35 % of the copy bandwidth where the decode kernel reaches 8-94 %)."""
    return (packed is None and seq_lens is None and config is None and group is None
            and few_query_rows(q.shape, k.shape))


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    seq_lens: torch.Tensor | None,
    config: AttnConfig | None = None,
    group: int | None = None,
    *,
    window: tuple[int, int] = (-1, -1),
    offset: int = 0,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    packed: Packed | None = None,
    need_lse: bool = True,
    keep_scratch: bool = False,
    compile_backward: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch the forward. q: (Z, H, N_q, D) or (Z, N_q, D); k: (Z, H_kv, N_k, D), v: (Z, H_kv, N_k, D_v),
    or 3-D with H = H_kv. Returns (out, lse): out (Z, H, N_q, D_v) in q's memory layout, lse fp32
    (..., N_q) contiguous. The variants (semantics.py): window (left, right), softcap, alibi_slopes
    fp32 (H,) or (Z, H) with unit last stride, sinks fp32 (H,) contiguous; offset, the diagonal offset
    (contract.band folds it into the window). config and group (the head group, see head_group) override
    the tuned choices, for benchmarks.
    packed: q (T_q, H, D), k (T_k, H_kv, D), v (T_k, H_kv, D_v) hold packed sequences (Packed), seq_lens
    is cu_seqlens_q; out is (T_q, H, D_v), lse (H, T_q).
    A few query rows (decode_route) run the decode kernel instead: split-KV over the keys, the q heads of a
    kv head packed into one tile; the same semantics (semantics.py), out and lse alike. There need_lse=False
    (a caller that drops lse) returns lse None, one allocation less; elsewhere lse is always returned.
    compile_backward: attention_bwd's keywords (deterministic, ...) where the caller will run the backward of
    this call: a call with no plan yet has the backward's kernels compile ahead, on worker threads while this
    thread compiles the forward's (attention_bwd's compile_only, its dout like out)."""
    if not offset and decode_route(q, k, seq_lens, packed, config, group):  # the decode kernel takes no offset
        return kvcache.attention_kvcache(q, k, v, None, None, None, None, causal, scale, window=window,
                                            softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                                            need_lse=need_lse, keep_scratch=keep_scratch)
    out = empty_out(q, v.shape[-1])
    lse = torch.empty(stats_shape(q, packed), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if packed is None:
        n_q, n_k, h_q, h_k, cu_k, extra = q.shape[-2], k.shape[-2], heads_of(q), heads_of(k), None, ()
    else:
        n_q, n_k, h_q, h_k, cu_k, extra = packed.max_q, packed.max_k, q.shape[1], k.shape[1], packed.cu_k, (
            packed.max_q, packed.max_k)
    var = variant(causal, window, softcap, n_q, n_k, h_q, h_k, offset)
    causal = var.causal
    env = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "seq_lens": seq_lens, "cu_k": cu_k,
           "alibi": alibi_slopes, "sinks": sinks}
    key = plan_key("fwd", (q, k, v, seq_lens, cu_k, alibi_slopes, sinks), var, scale, (config, group, *extra))
    plan = PLANS.get(key) if key is not None else None
    if plan is not None and aligned(out, lse):
        replay(plan, env)
        return out, lse
    if (compile_backward is not None and compile_ahead_on() and not INTERPRETED and q.is_cuda
            and not torch.cuda.is_current_stream_capturing()):
        try:
            attention_bwd(out, None, q, k, v, out, lse, causal, scale, seq_lens, window=window, offset=offset,
                          softcap=softcap, alibi_slopes=alibi_slopes, packed=packed, compile_only=True,
                          **compile_backward)
        except Exception:  # noqa: BLE001  (the forward goes on: the backward itself raises it, where it belongs)
            pass

    q4, k4, v4, o4 = as_4d(q, packed), as_4d(k, packed), as_4d(v, packed), as_4d(out, packed)
    lse3 = stats_3d(lse, q, packed)
    z, h, len_q, d = q4.shape  # len_q, len_k: the kernels' row counts (T_q, T_k when packed)
    len_k, dv = k4.shape[2], v4.shape[3]
    if packed is not None:
        z = seq_lens.shape[0] - 1  # one grid slice per sequence
    d_pad, dv_pad = head_dim_pad(d), v_pad(d, dv)
    work = z * h * n_q * n_k * d_pad
    short = work < HOST_DESC_MIN_WORK  # its host time decides: no host descriptors
    sm90 = hopper.tiles(q4, k4, v4, seq_lens, packed, alibi_slopes, sinks, config is not None or group is not None,
                        lambda: tma_ok(q4, k4, v4, o4) and host_descriptors_ok(q4, k4, v4, o4), short=short,
                        keys=lambda: mean_keys(var, n_q, n_k), window=var.window)
    env = {"q": q4, "k": k4, "v": v4, "out": o4, "lse": lse3, "seq_lens": seq_lens, "cu_k": cu_k,
           "alibi": alibi_slopes, "sinks": sinks}
    if sm90 is not None:  # the portable kernel runs only the Hopper kernel's second pass (its marked rows)
        cfg = MARKED_PASS_TILES
    elif config is not None:
        cfg = config
    elif var.window and causal:
        cfg = window_fwd_config(max(d_pad, dv_pad), q.dtype, q.device, INTERPRETED, max(n_q, n_k))
    else:
        cfg = fwd_config(max(d_pad, dv_pad), q.dtype, q.device, causal, INTERPRETED, max(n_q, n_k))
    tma = cfg.tma and tma_ok(q4, k4, v4)
    # descriptors built on the host where one per tensor serves every program: not with seq_lens, whose
    # per-program descriptors end at each sequence's valid length, nor for short calls (HOST_DESC_MIN_WORK)
    host_desc = tma and seq_lens is None and not short and host_descriptors_ok(q4, k4, v4)
    group = group or head_group(causal, cdiv(n_q, cfg.block_m), z * h, q.device)
    args = (*kernel_strides(q4, k4, v4, o4), *kernel_strides(lse3)[:2], alibi_stride(alibi_slopes), h, len_q, len_k,
            scale * LOG2E, group, var.kv_group, var.left, var.right, var.cap2)
    meta = dict(
        HEAD_DIM=d, HEAD_DIM_PAD=d_pad, HEAD_DIM_V=dv, HEAD_DIM_V_PAD=dv_pad,
        CAUSAL=causal, HAS_SEQ_LENS=seq_lens is not None,
        DOT_PRECISION=dot_precision(q.dtype), UPCAST=upcast(q.dtype), HOST_DESC=host_desc,
        LAZY=cfg.lazy, VOTE_ROWS=vote_rows(cfg, dv_pad) if cfg.lazy and not INTERPRETED else 0,
        MARK_ROWS=max(MARKED_PASS_ROWS, cfg.block_m),  # the second pass's rows a program
        SINKS=sinks is not None, VARLEN=packed is not None, **variant_meta(var, alibi_slopes),
        **_tile_meta(cfg, tma, seq_lens, n_q, n_k, rows_fit_int32(q4, k4, v4, o4)),
    )
    pointers = ("q", "k", "v", "out", "lse", "seq_lens", "cu_k", "alibi", "sinks")

    def portable(zc: int, m: dict) -> Launch:  # a pass of the portable kernel over chunk zc's batch slices
        rows = m["MARK_ROWS"] if m["PASS"] == 2 else cfg.block_m  # the second pass: a program a chunk of rows
        return Launch(_FWD, (cdiv(n_q, rows), h, zc), pointers, args, m)

    if sm90 is not None:  # the Hopper kernel runs the call, persistent, in one pass (overflow_passes)
        sm90_tiles = cdiv(n_q, sm90.block_m)
        fma = not var.softcap and scale > 0  # semantics._online_softmax_fma: rows it marks, the second pass redoes
        sm90_meta = dict(HEAD_DIM=d, HEAD_DIM_V=dv, CAUSAL=causal, WINDOW=var.window, SOFTCAP=var.softcap,
                         PASS=overflow_passes(q.dtype, None)[0], FMA=fma,
                         **sm90.meta(n_k, banded=causal or var.window), num_warps=4)
        rescue = dict(meta, PASS=2, **_RESCUE_META)  # MARKED_PASS_TILES: pointer loads, no descriptors

        blocks = cdiv(n_k, sm90.block_n)
        scratch = ()

        def sm90_launches(zc: int) -> list[Launch]:  # its programs take the chunk's tiles in turns (hopper.schedule)
            nonlocal scratch
            programs, group = hopper.schedule(sm90_tiles, zc * h, causal, q.device)
            # the last round cut into runs of key blocks (a batch launched in slices is not)
            cut = hopper.split(sm90_tiles, zc * h, blocks, programs, causal or var.window) if zc == z else None
            sm90_args = (*kernel_strides(lse3)[:2], len_q, len_k, scale * LOG2E, sm90_tiles, h, zc * h,
                         group, var.kv_group, var.left, var.right, var.cap2, *(cut[:2] if cut else (0, 1)))
            launches = [Launch(hopper.launcher(), (programs, 1, 1), hopper.POINTERS if cut else hopper.UNSPLIT_POINTERS,
                               sm90_args, sm90_meta)]
            if cut:  # the pieces merged into out and lse (merge.py), before the second pass reads lse's marks
                rows = cut.rest * cut.max_pieces * sm90.block_m
                scratch = (("split_o", (rows, dv), torch.float32), ("split_lse", (rows,), torch.float32))
                launches.append(Launch(_MERGE, (cut.rest, sm90.block_m // MERGE_ROWS, 1),
                                       ("split_o", "split_lse", "out", "lse"),
                                       (*o4.stride(), *kernel_strides(lse3)[:2], len_q, sm90_tiles, h, cut.first_lin,
                                        blocks, *cut[:2]),
                                       dict(BLOCK_M=sm90.block_m, HEAD_DIM_V=dv, ROWS=MERGE_ROWS,
                                            PIECES_PAD=1 << (cut.max_pieces - 1).bit_length(), num_warps=4)))
            return launches + ([portable(zc, rescue)] if fma else [])

        chunks = [(env_, sm90_launches(zc)) for zc, env_ in _z_chunks(z, env)]
        env.update(scratch_buffers(scratch, q.device))  # (one chunk where there is scratch: env is its tensors)
        launch_chunks(chunks, key if aligned(out, lse) else None, False, hopper.descriptors(sm90.block_n, d),
                      scratch=scratch, plans=PLANS)
        return out, lse
    passes = [dict(meta, PASS=p, **(_RESCUE_META if p == 2 else {}))
              for p in overflow_passes(q.dtype, work)]
    chunks = [(env_, [portable(zc, m) for m in passes]) for zc, env_ in _z_chunks(z, env)]
    descs = (("q", cfg.block_m, d_pad), ("k", cfg.block_n, d_pad), ("v", cfg.block_n, dv_pad)) if host_desc else ()
    # the interpreter emulates descriptors without scratch memory; host descriptors need none
    launch_chunks(chunks, key if aligned(out, lse) else None, tma and not host_desc and q.is_cuda, descs, plans=PLANS)
    return out, lse


PRE_BLOCK = 64  # query rows a program of the backward's row passes (preprocess, dq convert)


def _stat_rows(q: torch.Tensor, packed: Packed | None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The portable backward's per-row statistics, fp32 (Z, H, N_q), or (H, T_q) packed: delta = rowsum(dout *
    out) - dlse and lse2 = lse * log2(e); on q's device, or `device`."""
    delta = torch.empty(stats_shape(q, packed), dtype=torch.float32, device=device or q.device)
    return delta, torch.empty_like(delta)


def _preprocess_launch(row_grid: tuple, pre_args: tuple, stat_stride: int, d: int, d_pad: int, dv: int,
                       dv_pad: int, has_dlse: bool, zero_dq: bool, dq_rows: int) -> Launch:
    """The backward's preprocess (backward_rows.py): delta and lse2 with stat_stride rows a head, and (zero_dq)
    the zeros of dq's fp32 accumulator, dq_rows rows a head (N_q, or the Hopper backward's hopper.bwd_dq_rows,
    which row_grid's PRE_BLOCK-row blocks cover). pre_args: its strides, heads and N_q, as attention_bwd builds
    them."""
    assert not zero_dq or cdiv(dq_rows, PRE_BLOCK) <= row_grid[0], (dq_rows, row_grid)
    return Launch(_BWD_PRE, row_grid, ("out", "dout", "lse", "dlse", "delta", "lse2", "dq_acc"),
                  (*pre_args, stat_stride, dq_rows), dict(HEAD_DIM=dv, HEAD_DIM_PAD=dv_pad, BLOCK_M=PRE_BLOCK,
                                                          HAS_DLSE=has_dlse, ZERO_DQ=zero_dq, HEAD_DIM_Q=d,
                                                          HEAD_DIM_Q_PAD=d_pad))


def _split_scratch(z: int, h_kv: int, parts: int, len_k: int, d: int, dv: int) -> tuple[tuple, tuple[str, str]]:
    """(scratch specs, the dk/dv kernel's output names): fp32 partial sums of dk and dv over `parts` parts of
    each kv head's query-head group (head_split), or none and dk, dv themselves."""
    if parts == 1:
        return (), ("dk", "dv")
    return ((("dk_part", (z, h_kv * parts, len_k, d), torch.float32),
             ("dv_part", (z, h_kv * parts, len_k, dv), torch.float32)), ("dk_part", "dv_part"))


def _group_sum_launch(dk4: torch.Tensor, dv4: torch.Tensor, parts: int, grid_z: int) -> Launch:
    """The sum of dk_part and dv_part (_split_scratch) into dk and dv, in a fixed order."""
    h_kv, len_k, d = dk4.shape[1:]
    dv = dv4.shape[3]
    d_pad, dv_pad = head_dim_pad(d), v_pad(d, dv)
    block = max(16, 1 << (8192 // (d_pad + dv_pad)).bit_length() - 1)  # <= 64 fp32 registers a thread
    return Launch(_BWD_SUM, (cdiv(len_k, block), h_kv, grid_z), ("dk_part", "dv_part", "dk", "dv"),
                  (*kernel_strides(dk4, dv4), h_kv, len_k, parts),
                  dict(HEAD_DIM=d, HEAD_DIM_PAD=d_pad, HEAD_DIM_V=dv, HEAD_DIM_V_PAD=dv_pad, BLOCK_N=block,
                       num_warps=4))


def _dq_convert_launch(dq4: torch.Tensor, row_grid: tuple, scale: float, dq_rows: int, flat: bool = False,
                       unprescale: bool = False) -> Launch:
    """dq from its fp32 accumulator of dq_rows rows a head (flat: the Hopper backward's order and
    hopper.bwd_dq_rows), times the scale (unprescale: the Hopper backward's, also k's prescale undone), in dq's
    dtype and strides."""
    h, len_q, d = dq4.shape[1:]
    return Launch(_BWD_DQ_CONVERT, row_grid, ("dq_acc", "dq"),
                  (*kernel_strides(dq4), h, len_q, dq_rows, scale, scale * LOG2E),
                  dict(HEAD_DIM=d, HEAD_DIM_PAD=head_dim_pad(d), BLOCK_M=PRE_BLOCK, FLAT=flat, UNPRESCALE=unprescale))


def _hopper_backward(key, env: dict, var: Variant, scale: float, pre_args: tuple, batches: int, n_q: int,
                     n_k: int, *, compile_only: bool = False) -> None:
    """The Hopper backward (backward_sm90.py) of attention_bwd's (Z, H, N, D) views in env: the preprocess
    (delta and lse2 with hopper.stat_rows rows a head, dq's fp32 accumulator zeroed), the kernel (dk, dv, and
    dq added up by TMA reduces; on a small GQA grid dk and dv as fp32 partials over parts of the query-head
    group, head_split, summed by a last launch), and dq's conversion (times the scale) into its dtype.
    batches: the kernel's grid slices (the batch, or the packed sequences of the (1, H, T, D) views: varlen);
    n_q, n_k: the longest sequence's rows (the views' rows where not packed); env's seq_lens and cu_k as
    semantics._sequence takes them (cu_k given: packed sequences, seq_lens then cu_seqlens_q). compile_only:
    attention_bwd's (scratch on the meta device, nothing launched)."""
    q4, k4, dq4, dk4, dv4, dlse3 = env["q"], env["k"], env["dq"], env["dk"], env["dv"], env["dlse"]
    varlen = env["cu_k"] is not None
    has_seq_lens = env["seq_lens"] is not None and not varlen
    z, h, len_q, d = q4.shape  # z: the tensors' batch (1 when packed)
    h_kv, len_k = k4.shape[1], k4.shape[2]
    rows = hopper.stat_rows(len_q)
    key_blocks = cdiv(n_k, hopper.BWD_BLOCK_N)
    parts = head_split(var.kv_group, key_blocks * h_kv * batches, batches * h * n_q * n_k * d, q4.device,
                       max_heads=(hopper.BWD_GROUP_HEADS if var.causal and not var.window
                                  and n_q >= hopper.BWD_GROUP_MIN_ROWS else None))
    split_scratch, kv_out = _split_scratch(z, h_kv, parts, len_k, d, d)
    flat = not varlen  # dq's accumulator in the kernel's order
    dq_rows = hopper.bwd_dq_rows(len_q, varlen)  # its rows a head: the preprocess, the kernel, the convert
    scratch = (("delta", (z, h, rows), torch.float32), ("lse2", (z, h, rows), torch.float32),
               ("dq_acc", (z, h, dq_rows, d), torch.float32), *split_scratch)
    env.update(scratch_buffers(scratch, dq4.device))  # (meta with compile_only, as dq is)
    dk_out, dv_out = env[kv_out[0]], env[kv_out[1]]
    wide = hopper.bwd_wide(d, causal=var.causal, window=var.window, softcap=var.softcap, packed=varlen)
    kernel_meta = dict(CAUSAL=var.causal, WINDOW=var.window, SOFTCAP=var.softcap, HAS_SEQ_LENS=has_seq_lens,
                       VARLEN=varlen, HEAD_DIM=d, **hopper.bwd_meta(d, wide))

    def launches(zc: int) -> list[Launch]:
        z_rows = z if varlen else zc  # the row passes' batch: the tensors'
        row_grid = (cdiv(len_q, PRE_BLOCK), h, z_rows)
        args = (*kernel_strides(dk_out, dv_out), h, len_q, len_k, scale * LOG2E, scale,
                head_group(var.causal, key_blocks, zc * h_kv * parts, q4.device), var.kv_group, parts, rows,
                dq_rows, var.left, var.right, var.cap2)
        return [_preprocess_launch(row_grid, pre_args, rows, d, d, d, d, dlse3 is not None, True, dq_rows),
                Launch(hopper.backward_launcher(), (key_blocks, h_kv * parts, zc),
                       hopper.BWD_POINTERS + ("lse2", "delta", *kv_out, "seq_lens", "cu_k"), args, kernel_meta),
                *([_group_sum_launch(dk4, dv4, parts, z_rows)] if parts > 1 else []),
                _dq_convert_launch(dq4, row_grid, scale, dq_rows, flat=flat, unprescale=True)]

    descs = hopper.bwd_descriptors(d, packed=varlen, wide=wide)
    if varlen:  # packed q, k, v, dout: descriptors of their (1, H, T, D) views
        descs = tuple((spec[0], functools.partial(packed_host_descriptor, block_rows=spec[1], block_cols=spec[2],
                                                  gluon=True)) if spec[0] in ("q", "k", "v", "dout") else spec
                      for spec in descs)
    chunks = [(env, launches(batches))] if varlen else [(env_, launches(zc)) for zc, env_ in _z_chunks(z, env)]
    launch_chunks(chunks, key if aligned(dq4, dk4, dv4) else None, False, descs, scratch=scratch, plans=PLANS,
                  compile_only=compile_only)


# The one-pass backward (dq added up with fp32 atomic adds by the dk/dv kernel: 5 dots a tile pair against the
# two-kernel backward's 7) where it measured faster than the two-kernel one on the H200, with its own dk/dv
# tiles: padded head_dim -> (the shortest sequence it serves, the tiles). bench/results/bwd_one_pass_h200.jsonl:
# at D64, 64x64 tiles, 4 warps, 3 stages, TMA (a tile's share of dq is one bulk reduce) run 1.04-1.07x the
# two-kernel backward at N4096-8192 (MHA fp16, GQA bf16, causal or not) but 0.87x at B16 N1024; at D128 the
# dk, dv and dq tiles together spill registers (at most 1.01x with the best of seven tiles), D32 ties.
ONE_PASS: dict[int, tuple[int, AttnConfig | None]] = {64: (4096, AttnConfig(64, 64, 4, 3, tma=True))}
ONE_PASS_MAX_HEAD_DIM = 128  # above it the dk/dv tiles leave no shared memory for dq's share


def one_pass_backward(deterministic: bool, one_pass: bool | None, head_dim_pad: int, seq_len: int,
                      dtype: torch.dtype, tma: bool = True) -> bool:
    """Whether attention_bwd runs the one-pass backward (its deterministic and one_pass arguments; None: by
    ONE_PASS, for fp16 and bf16, where the device has TMA if the rule's tiles read through it)."""
    if one_pass and deterministic:
        raise ValueError("one_pass=True adds dq up with atomics: it cannot be deterministic")
    if one_pass and head_dim_pad > ONE_PASS_MAX_HEAD_DIM:
        raise ValueError(f"one_pass=True runs head_dim <= {ONE_PASS_MAX_HEAD_DIM} only, got a padded {head_dim_pad}")
    if one_pass is None:
        rule = ONE_PASS.get(head_dim_pad)
        return (not deterministic and rule is not None and seq_len >= rule[0]
                and dtype in (torch.float16, torch.bfloat16) and (tma or rule[1] is None or not rule[1].tma))
    return one_pass


def one_pass_of(q, v, n_q: int, n_k: int, deterministic: bool, one_pass: bool | None) -> bool:
    """one_pass_backward for a call's tensors (on every backward call's host path: the device is asked only
    for head_dims that ONE_PASS serves)."""
    pad = head_dim_pad(max(q.shape[-1], v.shape[-1]))  # = max(head_dim_pad(d), v_pad(d, dv)), the tables' key
    tma = pad in ONE_PASS and q.is_cuda and device_limits(q.device).tma
    return one_pass_backward(deterministic, one_pass, pad, max(n_q, n_k), q.dtype, tma)


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
    *,
    window: tuple[int, int] = (-1, -1),
    offset: int = 0,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    packed: Packed | None = None,
    split: int | None = None,
    deterministic: bool = True,
    one_pass: bool | None = None,
    compile_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward from the forward's out and lse. dout may have any strides (stride 0 too).
    Returns (dq, dk, dv) allocated with empty_like(q/k/v). deterministic: bitwise reproducible gradients
    (dq from the dq kernel). one_pass: the one-pass backward, dq added up with atomics by the dk/dv kernel
    (backward.py; not with deterministic, and head_dim <= 128 only; its own dk/dv tiles where ONE_PASS has
    them); None: where ONE_PASS says it is the faster one and deterministic is False. Not deterministic and
    one_pass not False: on Hopper the Gluon one-pass backward where hopper.backward_runs says so
    (_hopper_backward). The variants as in
    attention_fwd (sinks need nothing here: the saved lse includes them; their gradient is
    attention_torch.sinks_grad). config and group (the head
    group of both kernels, see head_group) override the tuned choices, for benchmarks. packed: packed
    sequences as in attention_fwd (lse and dlse (H, T_q)). split: over how many programs the dk/dv kernel
    splits a kv head's query-head group (a divisor of it; see head_split), for tests and benchmarks.
    compile_only: launch nothing, but have the kernels of this call compile ahead on worker threads
    (_launch.DirectLauncher.compile_ahead; attention_fwd's compile_backward); the outputs and scratch are then
    meta tensors (the kernels specialize on their dtypes and alignment only) and no plan is kept."""
    where = "meta" if compile_only else q.device  # the outputs' and scratch buffers' device
    dq, dk, dv = (torch.empty_like(t, device=where) for t in (q, k, v))
    if packed is None:
        n_q, n_k, h_q, h_k, cu_k, extra = q.shape[-2], k.shape[-2], heads_of(q), heads_of(k), None, ()
    else:
        n_q, n_k, h_q, h_k, cu_k, extra = packed.max_q, packed.max_k, q.shape[1], k.shape[1], packed.cu_k, (
            packed.max_q, packed.max_k)
    if n_q == 0 or n_k == 0 or q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    var = variant(causal, window, softcap, n_q, n_k, h_q, h_k, offset)
    causal = var.causal
    env = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse, "dlse": dlse, "dq": dq, "dk": dk,
           "dv": dv, "seq_lens": seq_lens, "cu_k": cu_k, "alibi": alibi_slopes, "dq_acc": None}
    # (scratch buffers join it by name: dq_acc where the one-pass backward runs; delta and lse2, padded, where
    # the Hopper backward does; else delta and lse2 of _stat_rows)
    atomic = one_pass_of(q, v, n_q, n_k, deterministic, one_pass)  # dq from the dk/dv kernel
    any_order = not deterministic and one_pass is not False  # the Hopper backward may run (hopper.backward_runs)
    key = plan_key("bwd", (q, k, v, out, dout, lse, dlse, seq_lens, cu_k, alibi_slopes), var, scale,
                    (config, group, split, atomic, any_order, *extra))
    plan = PLANS.get(key) if key is not None else None
    if plan is not None and compile_only:  # its kernels are bound already
        return dq, dk, dv
    if plan is not None:
        env.update(scratch_buffers(plan.scratch, q.device))
        if "delta" not in env:
            env["delta"], env["lse2"] = _stat_rows(q, packed)
        if aligned(dq, dk, dv, env["delta"], env["lse2"], *(env[name] for name, _, _ in plan.scratch)):
            replay(plan, env)
            return dq, dk, dv

    q4, k4, v4 = as_4d(q, packed), as_4d(k, packed), as_4d(v, packed)
    o4, g4 = as_4d(out, packed), as_4d(dout, packed)
    dq4, dk4, dv4 = as_4d(dq, packed), as_4d(dk, packed), as_4d(dv, packed)
    lse3, dlse3 = stats_3d(lse, q, packed), stats_3d(dlse, q, packed)
    z, h, len_q, d = q4.shape  # len_q, len_k: the kernels' row counts (T_q, T_k when packed)
    h_kv, len_k, dv_ = k4.shape[1], k4.shape[2], v4.shape[3]
    z_pre = z  # the delta pass runs over the (1, H, T_q) rows of a packed call
    if packed is not None:
        z = seq_lens.shape[0] - 1  # one grid slice per sequence
    d_pad, dv_pad = head_dim_pad(d), v_pad(d, dv_)
    pre_args = (*kernel_strides(o4, g4, lse3), *(kernel_strides(dlse3) if dlse3 is not None else (0, 0, 0)), h,
                len_q)
    if hopper.backward_runs(q4, v4, seq_lens, packed, alibi_slopes, (config, group, split) != (None, None, None),
                            deterministic, one_pass, lambda: tma_ok(q4, k4, v4, g4) and host_descriptors_ok(
                                q4, k4, v4, g4), short=z * h * n_q * n_k * d_pad < HOST_DESC_MIN_WORK,
                            program_rows=var.kv_group * n_q):
        _hopper_backward(key, {"q": q4, "k": k4, "v": v4, "out": o4, "dout": g4, "lse": lse3, "dlse": dlse3,
                               "dq": dq4, "dk": dk4, "dv": dv4, "seq_lens": seq_lens, "cu_k": cu_k}, var, scale,
                         pre_args, z, n_q, n_k, compile_only=compile_only)
        return dq, dk, dv
    delta, lse2 = _stat_rows(q, packed, where)
    delta3, lse23 = stats_3d(delta, q, packed), stats_3d(lse2, q, packed)
    cfg = config or bwd_config(max(d_pad, dv_pad), q.dtype, q.device, causal, INTERPRETED, max(n_q, n_k))
    one_pass_tiles = ONE_PASS.get(max(d_pad, dv_pad), (0, None))[1]
    if atomic and config is None and not INTERPRETED and one_pass_tiles is not None:
        cfg = cfg._replace(dkdv=one_pass_tiles)
    if any(c is not None and c.lazy for c in cfg):
        raise ValueError(f"{cfg}: lazy (rescaling) is a forward flag; the backward keeps no running max")
    q_cfg = cfg.dq
    kv_passes = cfg.dkdv_passes()  # one pass for dk and dv, or (split) a dv pass then a dk pass
    # TMA per kernel: dk/dv streams q and dout tiles, dq streams k and v tiles
    kv_tma_ok = any(kv_cfg.tma for kv_cfg, _, _ in kv_passes) and tma_ok(q4, g4)
    kv_tma = [kv_cfg.tma and kv_tma_ok for kv_cfg, _, _ in kv_passes]
    q_tma = q_cfg.tma and tma_ok(k4, v4)
    env = {"q": q4, "k": k4, "v": v4, "out": o4, "dout": g4, "lse": lse3, "dlse": dlse3, "delta": delta3,
           "lse2": lse23, "dq": dq4, "dk": dk4, "dv": dv4, "seq_lens": seq_lens, "cu_k": cu_k,
           "alibi": alibi_slopes, "dq_acc": None}
    common = dict(HEAD_DIM=d, HEAD_DIM_PAD=d_pad, HEAD_DIM_V=dv_, HEAD_DIM_V_PAD=dv_pad, CAUSAL=causal,
                  HAS_SEQ_LENS=seq_lens is not None, DOT_PRECISION=dot_precision(q.dtype), UPCAST=upcast(q.dtype),
                  VARLEN=packed is not None, **variant_meta(var, alibi_slopes))
    var_args = (var.left, var.right, var.cap2)
    # GQA on a small grid: the dk/dv programs write fp32 partial sums over parts of the query-head group
    # (heads h_kv * parts of scratch laid out as dk4, dv4), and a last launch adds them (head_split)
    parts = split or head_split(var.kv_group, cdiv(n_k, cfg.dkdv.block_n) * h_kv * z, z * h * n_q * n_k * d,
                                q.device)
    if var.kv_group % parts:
        raise ValueError(f"split={parts} must divide the {var.kv_group} query heads of a kv head")
    scratch, kv_out = _split_scratch(z_pre, h_kv, parts, len_k, d, dv_)
    if atomic:
        scratch += (("dq_acc", (z_pre, h, len_q, d), torch.float32),)
    env.update(scratch_buffers(scratch, where))
    dk_out, dv_out = env[kv_out[0]], env[kv_out[1]]
    row32 = rows_fit_int32(q4, k4, v4, g4, dq4, dk_out, dv_out)
    kv_strides = (*kernel_strides(q4, k4, v4, g4, dk_out, dv_out), alibi_stride(alibi_slopes))
    kv_launches = [  # (tiles, args, meta) of each dk/dv pass: one program per key block of a kv head (and part)
        (kv_cfg,
         (*kv_strides, h, len_q, len_k, scale * LOG2E, scale,
          group or head_group(causal, cdiv(n_k, kv_cfg.block_n), z * h_kv * parts, q.device), var.kv_group, parts,
          *var_args),
         dict(DO_DK=do_dk, DO_DV=do_dv, DQ_ATOMIC=atomic and do_dk, GQA=var.kv_group > 1,
              **_tile_meta(kv_cfg, tma, seq_lens, n_q, n_k, row32), **common))
        for (kv_cfg, do_dk, do_dv), tma in zip(kv_passes, kv_tma)
    ]
    q_group = group or head_group(causal, cdiv(n_q, q_cfg.block_m), z * h, q.device)
    q_args = (*kernel_strides(q4, k4, v4, g4, dq4), alibi_stride(alibi_slopes), h, len_q, len_k, scale * LOG2E, scale,
              q_group, var.kv_group, *var_args)
    q_meta = dict(**_tile_meta(q_cfg, q_tma, seq_lens, n_q, n_k, row32), **common)

    def launches(zc: int) -> list[Launch]:
        rows = (cdiv(len_q, PRE_BLOCK), h, z_pre if packed is not None else zc)  # the row passes' grid
        return [
            _preprocess_launch(rows, pre_args, len_q, d, d_pad, dv_, dv_pad, dlse3 is not None, atomic, len_q),
            *(Launch(_BWD_DKDV, (cdiv(n_k, kv_cfg.block_n), h_kv * parts, zc),
                      ("q", "k", "v", "dout", "lse2", "delta", *kv_out, "dq_acc", "seq_lens", "cu_k", "alibi"), kv_args,
                      kv_meta)
              for kv_cfg, kv_args, kv_meta in kv_launches),
            *([_group_sum_launch(dk4, dv4, parts, z_pre if packed is not None else zc)] if parts > 1 else []),
            _dq_convert_launch(dq4, rows, scale, len_q) if atomic else
            Launch(_BWD_DQ, (cdiv(n_q, q_cfg.block_m), h, zc),
                    ("q", "k", "v", "dout", "lse2", "delta", "dq", "seq_lens", "cu_k", "alibi"), q_args, q_meta),
        ]

    chunks = [(env_, launches(zc)) for zc, env_ in _z_chunks(z, env)]
    launch_chunks(chunks, key if aligned(dq, dk, dv, delta, lse2, dk_out, dv_out) else None,
                  (any(kv_tma) or q_tma) and q.is_cuda, scratch=scratch, plans=PLANS, compile_only=compile_only)
    return dq, dk, dv
