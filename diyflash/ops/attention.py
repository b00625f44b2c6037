"""diyflash::attention and its internal forward/backward ops.

Design:
- `diyflash::attention_fwd -> (out, lse)` is a custom_op with an exact fake and an autograd formula
  whose backward calls `diyflash::attention_bwd -> (dq, dk, dv)`, another custom_op with a fake. The
  backward reuses the forward's lse, so a compiled training step holds only diyflash ops.
- `diyflash::attention -> out` is defined with Library.define and a CompositeImplicitAutograd impl
  returning attention_fwd(...)[0]: users write torch.ops.diyflash.attention(q, k, v) and get a
  Tensor; torch.export keeps diyflash.attention in the graph and run_decompositions() lowers it to
  attention_fwd.

Devices: CUDA tensors run the Triton kernels; CPU tensors run the same kernels under
TRITON_INTERPRET=1 and the PyTorch blocked implementation otherwise; float64 always takes the
PyTorch path (it exists for gradcheck).
"""

from __future__ import annotations

import functools
import math

import torch
from torch.library import Library, custom_op

from ..kernels import device_guard, uses_triton
from ..kernels.attention_torch import attention_bwd_blocked, attention_fwd_blocked, sinks_grad
from ..kernels.contract import empty_out
from .checks import (INT32_MAX, check_attention_shapes, check_dtype, check_offset, check_seq_lens, check_variants,
                     one_device)
from .autocast import register_autocast
from .eager import dispatcher_free
from .forward_ad import guard_autograd, refuse_forward_ad
from .registry import NAMESPACE, entry
from .rules import for_kernels


def resolve_scale(scale: float | None, head_dim: int) -> float:
    # scale=None is resolved here, inside the op: a float that varies would recompile compiled graphs
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _prepare_seq_lens(seq_lens: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """(B,) lengths as the kernels read them: int32, contiguous, on the inputs' device (a handful of
    integers, so this costs nothing). No value is read on the host, so nothing waits for the GPU: int64
    lengths are clamped into int32 (2^32 + 3 had become 3 when converted; clamped, it stays past any
    N and the kernels clamp it to N, as every length to [0, N]; the API refuses it as longer than
    seq_len_k), and a CPU seq_lens beside CUDA inputs is copied through pinned memory, asynchronously
    (a copy from pageable memory waits for the GPU's queue)."""
    if seq_lens is None:
        return None
    if seq_lens.dtype == torch.int64:
        seq_lens = seq_lens.clamp(-INT32_MAX - 1, INT32_MAX)
    if (device.type == "cuda" and seq_lens.device.type == "cpu"
            and not torch.cuda.is_current_stream_capturing()):
        seq_lens = seq_lens.to(torch.int32).pin_memory().to(device, non_blocking=True)
    return seq_lens.to(device=device, dtype=torch.int32).contiguous()


@functools.cache  # an import statement costs ~1 us per call even when the module is loaded
def kernels_module():
    from ..kernels import attention as triton_attention  # imports triton (or explains its absence)

    return triton_attention


_FWD = entry("attention_fwd")
_BWD = entry("attention_bwd")
_ATTN = entry("attention")


def variant_kwargs(window_left, window_right, softcap, alibi_slopes, diagonal_offset=0):
    """The launchers' variant keywords (sinks go to the forward only: the backward reads them in lse;
    the diagonal offset only where the op takes one: the dense ops)."""
    var = dict(window=(int(window_left), int(window_right)), softcap=float(softcap), alibi_slopes=alibi_slopes)
    if diagonal_offset:
        var["offset"] = int(diagonal_offset)
    return var


def attention_fwd_impl(q, k, v, causal, scale, seq_lens, window_left=-1, window_right=-1, softcap=0.0,
                       alibi_slopes=None, sinks=None, diagonal_offset=0, need_lse=True, keep_scratch=False,
                       backward=False, deterministic=None):
    """What attention_fwd computes on a real device: its CUDA/CPU kernel, and the API's eager shortcut
    (need_lse=False where no caller sees lse: the decode route may then return lse None; keep_scratch=True
    from that shortcut only: kvcache.attention_kvcache says why). backward: the caller will run the backward
    (the eager autograd Function knows), with `deterministic`: its kernels then compile ahead beside the
    forward's on a call with no plan yet (the kernels' attention_fwd, compile_backward)."""
    scale = resolve_scale(scale, q.shape[-1])
    seq_lens = _prepare_seq_lens(seq_lens, q.device)
    alibi_slopes, sinks = prepare_variants(alibi_slopes, sinks)
    var = variant_kwargs(window_left, window_right, softcap, alibi_slopes, diagonal_offset)
    if uses_triton(q):
        with device_guard(q):
            return kernels_module().attention_fwd(q, k, v, causal, scale, seq_lens, sinks=sinks, need_lse=need_lse,
                                                  keep_scratch=keep_scratch,
                                                  compile_backward=backward_ahead(backward, deterministic), **var)
    return attention_fwd_blocked(q, k, v, causal, scale, seq_lens, sinks=sinks, **var)


def _check_qkv(op: str, q, k, v, seq_lens, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
               sinks=None, diagonal_offset=0) -> None:
    """What the ops themselves require, for callers of torch.ops.diyflash.* that skip the API's checks.
    Without it a k with a wider head_dim, or a v of another length, gave a silent wrong answer. The fakes
    run it too, so a compiled graph fails at trace time."""
    check_attention_shapes(op, q, k, v)
    check_dtype(op, q=q, k=k, v=v)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"diyflash::{op}: dtypes must match, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    one_device(op, q=q, k=k, v=v)
    check_seq_lens(op, seq_lens, q.shape[0], q.device)
    check_variants(op, q, window_left, window_right, softcap, alibi_slopes, sinks)
    check_offset(op, diagonal_offset, alibi_slopes)


def prepare_variants(alibi_slopes, sinks):
    """Slopes and sinks as the kernels read them (rules.for_kernels: a copy of at most B*H floats where the
    caller's are strided). Every implementation function applies it, so each route does: the op, the API's
    shortcut, and the eager backward, which gets the tensors autograd saved as the caller gave them."""
    return for_kernels(alibi_slopes), for_kernels(sinks)


@custom_op(_FWD.qualname, mutates_args=(), schema=_FWD.signature)
def attention_fwd(q, k, v, causal, scale, seq_lens, window_left=-1, window_right=-1, softcap=0.0,
                  alibi_slopes=None, sinks=None, diagonal_offset=0, deterministic=None):
    # deterministic: the backward's mode (setup_context keeps it); the forward is deterministic anyway
    _check_qkv("attention_fwd", q, k, v, seq_lens, window_left, window_right, softcap, alibi_slopes, sinks,
               diagonal_offset)
    return attention_fwd_impl(q, k, v, causal, scale, seq_lens, window_left, window_right, softcap,
                              alibi_slopes, sinks, diagonal_offset)


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    # lse is fp32; fp64 only for fp64 inputs
    return torch.float64 if dtype == torch.float64 else torch.float32


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, scale, seq_lens, window_left=-1, window_right=-1, softcap=0.0,
                        alibi_slopes=None, sinks=None, diagonal_offset=0, deterministic=None):
    _check_qkv("attention_fwd", q, k, v, seq_lens, window_left, window_right, softcap, alibi_slopes, sinks,
               diagonal_offset)
    # the launchers' allocation list, nothing else
    return empty_out(q, v.shape[-1]), q.new_empty(q.shape[:-1], dtype=lse_dtype(q.dtype))


def check_saved(op: str, fwd: str, dout, dlse, q, v, out, lse, lse_shape) -> None:
    """A backward op's own inputs beside q and v: dout and out shaped (..., D_v) like the forward's output
    and of q's dtype, lse and dlse shaped lse_shape in the forward's lse dtype, all on q's device."""
    one_device(op, q=q, dout=dout, dlse=dlse, out=out, lse=lse)
    out_shape = (*q.shape[:-1], v.shape[-1])
    for name, t, shape in (("dout", dout, out_shape), ("out", out, out_shape), ("lse", lse, lse_shape),
                           ("dlse", dlse, lse_shape)):
        if t is not None and tuple(t.shape) != tuple(shape):
            raise ValueError(f"diyflash::{op}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if dout.dtype != q.dtype or out.dtype != q.dtype:
        raise TypeError(f"diyflash::{op}: dout and out must have q's dtype {q.dtype}, "
                        f"got dout {dout.dtype}, out {out.dtype}")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is not None and t.dtype != lse_dtype(q.dtype):
            raise TypeError(f"diyflash::{op}: {name} must have {fwd}'s lse dtype "
                            f"{lse_dtype(q.dtype)} for {q.dtype} inputs, got {t.dtype}")


def _check_bwd(dout, dlse, q, k, v, out, lse, seq_lens, window_left, window_right, softcap, alibi_slopes,
               sinks, diagonal_offset) -> None:
    _check_qkv("attention_bwd", q, k, v, seq_lens, window_left, window_right, softcap, alibi_slopes, sinks,
               diagonal_offset)
    check_saved("attention_bwd", "attention_fwd", dout, dlse, q, v, out, lse, q.shape[:-1])


def no_sinks_grad(q: torch.Tensor) -> torch.Tensor:
    # attention_bwd's dsinks without sinks: empty (a custom op returns a tensor, never None)
    return q.new_empty((0,), dtype=lse_dtype(q.dtype))


def resolve_deterministic(deterministic: bool | None) -> bool:
    """A backward's mode: the argument, or where it is None PyTorch's switch
    (torch.use_deterministic_algorithms), read when the backward runs, as PyTorch's own kernels do."""
    return torch.are_deterministic_algorithms_enabled() if deterministic is None else bool(deterministic)


def backward_ahead(backward: bool, deterministic: bool | None) -> dict | None:
    """The kernels' attention_fwd compile_backward argument: the backward's keywords where the caller will run
    it (an eager autograd Function's forward knows), else None."""
    return dict(deterministic=resolve_deterministic(deterministic)) if backward else None


def _attention_bwd_impl(dout, dlse, q, k, v, out, lse, causal, scale, seq_lens, window_left=-1, window_right=-1,
                        softcap=0.0, alibi_slopes=None, sinks=None, diagonal_offset=0, deterministic=None):
    """What attention_bwd computes on a real device: its CUDA/CPU kernel, and the autograd formula's
    eager shortcut. The PyTorch path is deterministic in either mode."""
    scale = resolve_scale(scale, q.shape[-1])
    seq_lens = _prepare_seq_lens(seq_lens, q.device)
    alibi_slopes, sinks = prepare_variants(alibi_slopes, sinks)
    var = variant_kwargs(window_left, window_right, softcap, alibi_slopes, diagonal_offset)
    if uses_triton(q):
        with device_guard(q):
            dq, dk, dv = kernels_module().attention_bwd(dout, dlse, q, k, v, out, lse, causal, scale, seq_lens,
                                                        deterministic=resolve_deterministic(deterministic), **var)
    else:
        dq, dk, dv = attention_bwd_blocked(dout, dlse, q, k, v, out, lse, causal, scale, seq_lens, **var)
    dsinks = no_sinks_grad(q) if sinks is None else sinks_grad(sinks, out, dout, lse, dlse)
    return dq, dk, dv, dsinks


@custom_op(_BWD.qualname, mutates_args=(), schema=_BWD.signature)
def attention_bwd(dout, dlse, q, k, v, out, lse, causal, scale, seq_lens, window_left=-1, window_right=-1,
                  softcap=0.0, alibi_slopes=None, sinks=None, diagonal_offset=0, deterministic=None):
    _check_bwd(dout, dlse, q, k, v, out, lse, seq_lens, window_left, window_right, softcap, alibi_slopes, sinks,
               diagonal_offset)
    return _attention_bwd_impl(dout, dlse, q, k, v, out, lse, causal, scale, seq_lens, window_left, window_right,
                               softcap, alibi_slopes, sinks, diagonal_offset, deterministic)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, dlse, q, k, v, out, lse, causal, scale, seq_lens, window_left=-1, window_right=-1,
                        softcap=0.0, alibi_slopes=None, sinks=None, diagonal_offset=0, deterministic=None):
    _check_bwd(dout, dlse, q, k, v, out, lse, seq_lens, window_left, window_right, softcap, alibi_slopes, sinks,
               diagonal_offset)
    dsinks = no_sinks_grad(q) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


def setup_context(ctx, inputs, output):
    (q, k, v, causal, scale, seq_lens, window_left, window_right, softcap, alibi_slopes, sinks, diagonal_offset,
     deterministic) = inputs
    out, lse = output
    # every gradient needs all of q, k, v, out and lse (p = exp(s - lse) and ds = p * (dp - delta))
    ctx.save_for_backward(q, k, v, out, lse, seq_lens, alibi_slopes, sinks)
    ctx.causal = causal
    ctx.scale = scale
    ctx.window = (window_left, window_right)
    ctx.softcap = softcap
    ctx.offset = diagonal_offset
    ctx.deterministic = deterministic  # None: resolved when the backward runs (resolve_deterministic)
    # An output the loss does not use arrives as None instead of a zero tensor. The usual case is an
    # unused lse: its zeros cost an allocation, a fill and a read per backward call.
    ctx.set_materialize_grads(False)


def attention_backward(ctx, dout, dlse):
    if dout is None and dlse is None:
        return (None,) * 13
    q, k, v, out, lse, seq_lens, alibi_slopes, sinks = ctx.saved_tensors
    if dout is None:  # only lse feeds the loss: a stride-0 zero dout, read in place by the kernels
        dout = out.new_zeros(()).expand_as(out)
    args = (dout, dlse, q, k, v, out, lse, ctx.causal, ctx.scale, seq_lens, *ctx.window, ctx.softcap,
            alibi_slopes, sinks, ctx.offset, ctx.deterministic)
    # Eager backward with nothing to observe the op (ops/eager.py; autograd's own checks already gave
    # dout and dlse their outputs' shapes): the implementation itself, ~25-35 us less host time per
    # call. Compiled autograd, export, modes, the profiler and double backward see the op.
    if dispatcher_free(dout, dlse, q, k, v, out, lse, seq_lens, alibi_slopes, sinks):
        dq, dk, dv, dsinks = _attention_bwd_impl(*args)
    else:
        dq, dk, dv, dsinks = torch.ops.diyflash.attention_bwd(*args)
    return dq, dk, dv, None, None, None, None, None, None, None, (dsinks if sinks is not None else None), None, None


attention_fwd.register_autograd(attention_backward, setup_context=setup_context)
guard_autograd(attention_fwd)
guard_autograd(attention_bwd)  # no backward of its own: a tangent would vanish there too
register_autocast(attention_fwd, cast=("q", "k", "v"))
register_autocast(attention_bwd, cast=("dout", "q", "k", "v", "out"))  # lse, dlse, slopes and sinks stay fp32


class _EagerAttention(torch.autograd.Function):
    """diyflash::attention under eager autograd without the dispatcher: the same forward implementation,
    the same setup_context and the same backward formula as attention_fwd's autograd (so the same
    saved tensors, the same kernels and bit-identical results; a double backward meets the same
    refusal), minus the custom op's dispatch and its generated autograd wrapper, which cost ~55 us of
    host time per forward on the H200 machine (bench/overhead.py). Only call_attention uses it, and only
    where dispatcher_free(..., autograd=True) holds. Returns (out, lse); lse is differentiable too."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, seq_lens, *variants):
        # variants: attention_fwd's arguments after seq_lens, the last (deterministic) for the backward only
        out, lse = attention_fwd_impl(q, k, v, causal, scale, seq_lens, *variants[:-1],
                                      backward=any(ctx.needs_input_grad[:3]), deterministic=variants[-1])
        setup_context(ctx, (q, k, v, causal, scale, seq_lens, *variants), (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return attention_backward(ctx, dout, dlse)


# The op users call. Kept alive for the life of the process: dropping a Library deregisters its ops.
_lib = Library(NAMESPACE, "FRAGMENT")
_lib.define(_ATTN.schema)


def _attention_composite(q, k, v, causal=False, scale=None, seq_lens=None, window_left=-1, window_right=-1,
                         softcap=0.0, alibi_slopes=None, sinks=None, diagonal_offset=0, deterministic=None):
    refuse_forward_ad("attention", q, k, v, sinks)
    return torch.ops.diyflash.attention_fwd(q, k, v, causal, scale, seq_lens, window_left, window_right, softcap,
                                            alibi_slopes, sinks, diagonal_offset, deterministic)[0]


_lib.impl(_ATTN.name, _attention_composite, "CompositeImplicitAutograd")


def call_attention(q, k, v, causal=False, scale=None, seq_lens=None, window_left=-1, window_right=-1, softcap=0.0,
                   alibi_slopes=None, sinks=None, return_lse=False, deterministic=None):
    """diyflash::attention (or, with return_lse, diyflash::attention_fwd) for the Python API, by the
    shortest path nothing can tell apart from the op (ops/eager.py): the forward implementation itself
    when no tracer, mode, subclass or autograd could see it; with autograd, _EagerAttention (the autograd
    formula of attention_fwd, the op diyflash::attention lowers to, in a plain autograd.Function); else
    the op through the dispatcher."""
    refuse_forward_ad("attention", q, k, v, sinks)
    variants = (window_left, window_right, softcap, alibi_slopes, sinks)
    tensors = (q, k, v, seq_lens, alibi_slopes, sinks)
    if dispatcher_free(*tensors):
        out, lse = attention_fwd_impl(q, k, v, causal, scale, seq_lens, window_left, window_right, softcap,
                                      alibi_slopes, sinks, need_lse=return_lse, keep_scratch=True)
    elif dispatcher_free(*tensors, autograd=True):
        out, lse = _EagerAttention.apply(q, k, v, causal, scale, seq_lens, window_left, window_right, softcap,
                                         alibi_slopes, sinks, 0, deterministic)
    elif return_lse:
        return torch.ops.diyflash.attention_fwd(q, k, v, causal, scale, seq_lens, *variants, 0, deterministic)
    else:
        return torch.ops.diyflash.attention(q, k, v, causal=causal, scale=scale, seq_lens=seq_lens,
                                            window_left=window_left, window_right=window_right, softcap=softcap,
                                            alibi_slopes=alibi_slopes, sinks=sinks, deterministic=deterministic)
    return (out, lse) if return_lse else out
