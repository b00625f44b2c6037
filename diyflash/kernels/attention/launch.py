"""The attention forward's launcher (attention_fwd): tiles, TMA and offset choices per call, head groups, the
Hopper kernel's schedule and split, and the plans (plans.py) that replay a call's launches. The backward's is
launch_bwd.py; this module registers every dense kernel's launcher (their shared hash, their kept bindings)."""

from __future__ import annotations

import torch

from .._runtime import keep, require_triton
from ..contract import LOG2E, empty_out, few_query_rows, mean_keys, variant
from ..attention_configs import AttnConfig, fwd_config, head_dim_pad, window_fwd_config

require_triton()  # before anything imports triton: its absence is then the error table's "triton is required"

from .._compile import compile_ahead_on, hash_first  # noqa: E402
from .._launch import DirectLauncher, cdiv  # noqa: E402
from . import hopper, kvcache  # noqa: E402  (the decode route; kvcache shares launch_args and plans, not this module)
from .forward import _attn_fwd_kernel  # noqa: E402
from .merge import _attn_merge_pieces_kernel  # noqa: E402
from .launch_args import (INTERPRETED, alibi_stride, dot_precision, tile_meta, upcast, v_pad,  # noqa: E402
                          variant_meta)
from .launch_bwd import BWD_LAUNCHERS, attention_bwd  # noqa: E402
from .lazy import RESCALE_N, VOTE_PACKS  # noqa: E402
from .grids import head_group  # noqa: E402
from .plans import (HOST_DESC_MIN_WORK, PLANS, aligned, host_descriptors_ok, launch_chunks, Launch,  # noqa: E402
                    plan_key, replay, scratch_buffers, z_chunks)
from .views import Packed, as_4d, call_dims, kernel_strides, rows_fit_int32, stats_3d, stats_shape, tma_ok  # noqa: E402


# Each kernel launches through its DirectLauncher: the JIT's binding once per call signature, then
# the compiled kernel directly (~20 us less host time per launch; _launch.py). On top of that, a call
# whose inputs were seen before (same dtypes, shapes, strides, 16-byte alignment, options) replays a
# plan: the launches it made the first time, bound to their compiled kernels, fed this call's tensors.
# That skips choosing tiles, checking TMA, computing strides and every launch's signature: the host
# cost that dominates a short sequence (a backward is four launches).
_FWD = DirectLauncher(_attn_fwd_kernel)
_MERGE = DirectLauncher(_attn_merge_pieces_kernel)
assert INTERPRETED == _FWD.interpreted  # launch_args decides it as Triton decorated these kernels


_LAUNCHERS = (_FWD, *BWD_LAUNCHERS, _MERGE)


def _attention_kernels() -> list:
    """Every attention kernel, in one order (_compile.hash_first: the kernels share semantics.py's helpers); none
    under the interpreter (nothing compiles)."""
    if INTERPRETED:
        return []
    hoppers = ((hopper.kernel_module(), "_hopper_fwd_kernel"), (hopper.backward_module(), "_hopper_bwd_kernel"))
    return [*(lc.kernel for lc in (*_LAUNCHERS, *kvcache.LAUNCHERS)),
            *(getattr(module, name) for module, name in hoppers if not isinstance(module, str))]


hash_first(_attention_kernels)

keep("attention bound kernels",
     lambda: [lc._compiled for lc in (*_LAUNCHERS, *hopper.LAUNCHERS.values())])


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
    n_q, n_k, h_q, h_k, cu_k, extra = call_dims(q, k, packed)
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
        **tile_meta(cfg, tma, seq_lens, n_q, n_k, rows_fit_int32(q4, k4, v4, o4)),
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

        chunks = [(env_, sm90_launches(zc)) for zc, env_ in z_chunks(z, env)]
        env.update(scratch_buffers(scratch, q.device))  # (one chunk where there is scratch: env is its tensors)
        launch_chunks(chunks, key if aligned(out, lse) else None, False, hopper.descriptors(sm90.block_n, d),
                      scratch=scratch, plans=PLANS)
        return out, lse
    passes = [dict(meta, PASS=p, **(_RESCUE_META if p == 2 else {}))
              for p in overflow_passes(q.dtype, work)]
    chunks = [(env_, [portable(zc, m) for m in passes]) for zc, env_ in z_chunks(z, env)]
    descs = (("q", cfg.block_m, d_pad), ("k", cfg.block_n, d_pad), ("v", cfg.block_n, dv_pad)) if host_desc else ()
    # the interpreter emulates descriptors without scratch memory; host descriptors need none
    launch_chunks(chunks, key if aligned(out, lse) else None, tma and not host_desc and q.is_cuda, descs, plans=PLANS)
    return out, lse
