"""The attention backward's launcher (attention_bwd): the portable kernels' passes (the row preprocess, dk/dv,
dq, or the one-pass backward's dq atomics and conversion; a small GQA grid's head split and its sum) or the
Hopper kernel's (_hopper_backward), and the plans (plans.py) that replay a call's launches."""

from __future__ import annotations

import functools

import torch

from .._runtime import device_limits, require_triton
from ..contract import LOG2E, Variant, variant
from ..attention_configs import AttnConfig, BwdConfig, bwd_config, head_dim_pad

require_triton()  # before anything imports triton: its absence is then the error table's "triton is required"

from .._launch import DirectLauncher, cdiv  # noqa: E402
from .backward import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel  # noqa: E402
from .backward_rows import (_attn_bwd_dq_convert_kernel, _attn_bwd_group_sum_kernel,  # noqa: E402
                            _attn_bwd_preprocess_kernel)
from . import hopper  # noqa: E402
from .launch_args import INTERPRETED, alibi_stride, dot_precision, tile_meta, upcast, v_pad, variant_meta  # noqa: E402
from .grids import head_group, head_split  # noqa: E402
from .plans import (HOST_DESC_MIN_WORK, PLANS, aligned, host_descriptors_ok, launch_chunks, Launch,  # noqa: E402
                    packed_host_descriptor, plan_key, replay, scratch_buffers, z_chunks)
from .views import Packed, as_4d, call_dims, kernel_strides, rows_fit_int32, stats_3d, stats_shape, tma_ok  # noqa: E402


# Each kernel launches through its DirectLauncher (launch.py says why)
_BWD_PRE = DirectLauncher(_attn_bwd_preprocess_kernel)
_BWD_DKDV = DirectLauncher(_attn_bwd_dkdv_kernel)
_BWD_DQ = DirectLauncher(_attn_bwd_dq_kernel)
_BWD_SUM = DirectLauncher(_attn_bwd_group_sum_kernel)
_BWD_DQ_CONVERT = DirectLauncher(_attn_bwd_dq_convert_kernel)
BWD_LAUNCHERS = (_BWD_PRE, _BWD_DKDV, _BWD_DQ, _BWD_SUM, _BWD_DQ_CONVERT)


PRE_BLOCK = 64  # query rows a program of the backward's row passes (preprocess, dq convert)


def _stat_rows(q: torch.Tensor, packed: Packed | None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The portable backward's per-row statistics, fp32 (Z, H, N_q), or (H, T_q) packed: delta = rowsum(dout *
    out) - dlse and lse2 = lse * log2(e); on q's device, or `device`."""
    delta = torch.empty(stats_shape(q, packed), dtype=torch.float32, device=device or q.device)
    return delta, torch.empty_like(delta)


def _preprocess_launch(row_grid: tuple, pre_args: tuple, stat_stride: int, d: int, d_pad: int, dv: int,
                       dv_pad: int, has_dlse: bool, zero_dq: bool, dq_rows: int,
                       shifted_by: float | None = None) -> Launch:
    """The backward's preprocess (backward_rows.py): delta and lse2 with stat_stride rows a head, and (zero_dq)
    the zeros of dq's fp32 accumulator, dq_rows rows a head (N_q, or the Hopper backward's hopper.bwd_dq_rows,
    which row_grid's PRE_BLOCK-row blocks cover). pre_args: its strides, heads and N_q, as attention_bwd builds
    them. shifted_by: the qk_scale of a Hopper backward with STATS_ACC, whose stats the pass stores shifted
    (semantics._stats_shifted)."""
    assert not zero_dq or cdiv(dq_rows, PRE_BLOCK) <= row_grid[0], (dq_rows, row_grid)
    return Launch(_BWD_PRE, row_grid, ("out", "dout", "lse", "dlse", "delta", "lse2", "dq_acc"),
                  (*pre_args, stat_stride, dq_rows, 1.0 if shifted_by is None else shifted_by),
                  dict(HEAD_DIM=dv, HEAD_DIM_PAD=dv_pad, BLOCK_M=PRE_BLOCK, HAS_DLSE=has_dlse, ZERO_DQ=zero_dq,
                       HEAD_DIM_Q=d, HEAD_DIM_Q_PAD=d_pad, SHIFTED=shifted_by is not None))


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
                       VARLEN=varlen, HEAD_DIM=d, **hopper.bwd_meta(d, wide, softcap=var.softcap))

    def launches(zc: int) -> list[Launch]:
        z_rows = z if varlen else zc  # the row passes' batch: the tensors'
        row_grid = (cdiv(len_q, PRE_BLOCK), h, z_rows)
        args = (*kernel_strides(dk_out, dv_out), h, len_q, len_k, scale * LOG2E, scale,
                head_group(var.causal, key_blocks, zc * h_kv * parts, q4.device), var.kv_group, parts, rows,
                dq_rows, var.left, var.right, var.cap2)
        return [_preprocess_launch(row_grid, pre_args, rows, d, d, d, d, dlse3 is not None, True, dq_rows,
                                   shifted_by=scale * LOG2E if kernel_meta["STATS_ACC"] else None),
                Launch(hopper.backward_launcher(), (key_blocks, h_kv * parts, zc),
                       hopper.BWD_POINTERS + ("lse2", "delta", *kv_out, "seq_lens", "cu_k"), args, kernel_meta),
                *([_group_sum_launch(dk4, dv4, parts, z_rows)] if parts > 1 else []),
                _dq_convert_launch(dq4, row_grid, scale, dq_rows, flat=flat, unprescale=True)]

    descs = hopper.bwd_descriptors(d, packed=varlen, wide=wide)
    if varlen:  # packed q, k, v, dout: descriptors of their (1, H, T, D) views
        descs = tuple((spec[0], functools.partial(packed_host_descriptor, block_rows=spec[1], block_cols=spec[2],
                                                  gluon=True)) if spec[0] in ("q", "k", "v", "dout") else spec
                      for spec in descs)
    chunks = [(env, launches(batches))] if varlen else [(env_, launches(zc)) for zc, env_ in z_chunks(z, env)]
    launch_chunks(chunks, key if aligned(dq4, dk4, dv4) else None, False, descs, scratch=scratch, plans=PLANS,
                  compile_only=compile_only)


# The one-pass backward (dq added up with fp32 atomic adds by the dk/dv kernel: 5 dots a tile pair against the
# two-kernel backward's 7) where it measured faster than the two-kernel one on the H200, with its own dk/dv
# tiles: padded head_dim -> (the shortest sequence it serves, the tiles). At D64 on 64x64 tiles (TMA: a tile's
# share of dq is one bulk reduce) it ran 1.04-1.07x the two-kernel backward from N4096, and lost at N1024
# (bench/results/bwd_one_pass_h200.jsonl); at D128 its tiles spill registers, and D32 ties.
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
    n_q, n_k, h_q, h_k, cu_k, extra = call_dims(q, k, packed)
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
              **tile_meta(kv_cfg, tma, seq_lens, n_q, n_k, row32), **common))
        for (kv_cfg, do_dk, do_dv), tma in zip(kv_passes, kv_tma)
    ]
    q_group = group or head_group(causal, cdiv(n_q, q_cfg.block_m), z * h, q.device)
    q_args = (*kernel_strides(q4, k4, v4, g4, dq4), alibi_stride(alibi_slopes), h, len_q, len_k, scale * LOG2E, scale,
              q_group, var.kv_group, *var_args)
    q_meta = dict(**tile_meta(q_cfg, q_tma, seq_lens, n_q, n_k, row32), **common)

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

    chunks = [(env_, launches(zc)) for zc, env_ in z_chunks(z, env)]
    launch_chunks(chunks, key if aligned(dq, dk, dv, delta, lse2, dk_out, dv_out) else None,
                  (any(kv_tma) or q_tma) and q.is_cuda, scratch=scratch, plans=PLANS, compile_only=compile_only)
    return dq, dk, dv
