"""diyflash::attention_varlen (packed sequences) and its internal forward/backward ops.

The same design as ops/attention.py: `attention_varlen_fwd -> (out, lse)` is a custom_op with an exact
fake and an autograd formula calling `attention_varlen_bwd`; `attention_varlen -> out` is a composite
returning attention_varlen_fwd(...)[0]. The kernels are the dense ones with their VARLEN flag
(semantics._sequence): one launch for the whole batch, no host sync, max_seqlen_* only size the grid.
"""

from __future__ import annotations

import torch
from torch.library import Library, custom_op

from ..kernels import device_guard, uses_triton
from ..kernels.attention_torch import attention_bwd_blocked, attention_fwd_blocked, sinks_grad
from ..kernels.contract import empty_out
from .attention import (backward_ahead, check_saved, kernels_module, lse_dtype, no_sinks_grad, prepare_variants,
                        resolve_deterministic, resolve_scale, variant_kwargs)
from .autocast import register_autocast
from .checks import check_dtype, check_variants, check_varlen, one_device
from .eager import dispatcher_free
from .forward_ad import guard_autograd, refuse_forward_ad
from .registry import NAMESPACE, entry
from .rules import for_kernels

_FWD = entry("attention_varlen_fwd")
_BWD = entry("attention_varlen_bwd")
_ATTN = entry("attention_varlen")


def _check(op: str, q, k, v, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap, alibi_slopes,
           sinks) -> None:
    check_varlen(op, q, k, v, cu_q, cu_k, max_q, max_k)
    check_dtype(op, q=q, k=k, v=v)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"diyflash::{op}: dtypes must match, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    one_device(op, q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    check_variants(op, q, window_left, window_right, softcap, alibi_slopes, sinks, packed_batch=cu_q.shape[0] - 1)


def _packed(cu_k, max_q, max_k):
    return (cu_k, int(max_q), int(max_k))


def _fwd_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window_left=-1, window_right=-1, softcap=0.0,
              alibi_slopes=None, sinks=None, backward=False, deterministic=None):
    """attention_varlen_fwd's implementation. backward: the caller will run the backward (the eager autograd
    Function knows), with `deterministic`: its kernels then compile ahead beside the forward's on a call with no
    plan yet (ops/attention.py's attention_fwd_impl does the same)."""
    scale = resolve_scale(scale, q.shape[-1])
    cu_q, cu_k = for_kernels(cu_q), for_kernels(cu_k)  # the kernels read cu_seqlens with unit stride
    alibi_slopes, sinks = prepare_variants(alibi_slopes, sinks)
    var = variant_kwargs(window_left, window_right, softcap, alibi_slopes)
    if uses_triton(q):
        with device_guard(q):
            kernels = kernels_module()
            return kernels.attention_fwd(q, k, v, causal, scale, cu_q, sinks=sinks,
                                         packed=kernels.Packed(*_packed(cu_k, max_q, max_k)),
                                         compile_backward=backward_ahead(backward, deterministic), **var)
    return attention_fwd_blocked(q, k, v, causal, scale, cu_q, sinks=sinks, packed=_packed(cu_k, max_q, max_k), **var)


@custom_op(_FWD.qualname, mutates_args=(), schema=_FWD.signature)
def attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                         window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None,
                         deterministic=None):
    # deterministic: the backward's mode (_setup_context keeps it)
    _check("attention_varlen_fwd", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left,
           window_right, softcap, alibi_slopes, sinks)
    return _fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window_left,
                     window_right, softcap, alibi_slopes, sinks)


@attention_varlen_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window_left=-1,
              window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, deterministic=None):
    _check("attention_varlen_fwd", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left,
           window_right, softcap, alibi_slopes, sinks)
    return empty_out(q, v.shape[-1]), q.new_empty((q.shape[1], q.shape[0]), dtype=lse_dtype(q.dtype))


def _check_bwd(dout, dlse, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap,
               alibi_slopes, sinks) -> None:
    _check("attention_varlen_bwd", q, k, v, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap,
           alibi_slopes, sinks)
    check_saved("attention_varlen_bwd", "attention_varlen_fwd", dout, dlse, q, v, out, lse, (q.shape[1], q.shape[0]))


def _bwd_impl(dout, dlse, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, window_left=-1,
              window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, deterministic=None):
    scale = resolve_scale(scale, q.shape[-1])
    cu_q, cu_k = for_kernels(cu_q), for_kernels(cu_k)
    alibi_slopes, sinks = prepare_variants(alibi_slopes, sinks)
    var = variant_kwargs(window_left, window_right, softcap, alibi_slopes)
    if uses_triton(q):
        with device_guard(q):
            kernels = kernels_module()
            dq, dk, dv = kernels.attention_bwd(dout, dlse, q, k, v, out, lse, causal, scale, cu_q,
                                               packed=kernels.Packed(*_packed(cu_k, max_q, max_k)),
                                               deterministic=resolve_deterministic(deterministic), **var)
    else:
        dq, dk, dv = attention_bwd_blocked(dout, dlse, q, k, v, out, lse, causal, scale, cu_q,
                                           packed=_packed(cu_k, max_q, max_k), **var)
    if sinks is None:
        dsinks = no_sinks_grad(q)
    else:  # sinks_grad reads (Z, H, N) rows: packed (T, H) rows as (1, H, T)
        dsinks = sinks_grad(sinks, out.transpose(0, 1).unsqueeze(0), dout.transpose(0, 1).unsqueeze(0),
                            lse.unsqueeze(0), None if dlse is None else dlse.unsqueeze(0))
    return dq, dk, dv, dsinks


@custom_op(_BWD.qualname, mutates_args=(), schema=_BWD.signature)
def attention_varlen_bwd(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal, scale, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None,
                         deterministic=None):
    _check_bwd(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left,
               window_right, softcap, alibi_slopes, sinks)
    return _bwd_impl(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                     scale, window_left, window_right, softcap, alibi_slopes, sinks, deterministic)


@attention_varlen_bwd.register_fake
def _bwd_fake(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
              window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, deterministic=None):
    _check_bwd(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left,
               window_right, softcap, alibi_slopes, sinks)
    dsinks = no_sinks_grad(q) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window_left, window_right, softcap, alibi_slopes,
     sinks, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, sinks)
    ctx.args = (max_q, max_k, causal, scale)
    ctx.variants = (window_left, window_right, softcap)
    ctx.deterministic = deterministic
    ctx.set_materialize_grads(False)  # an unused lse arrives as None: no zeros to allocate and read


def _backward(ctx, dout, dlse):
    if dout is None and dlse is None:
        return (None,) * 15
    q, k, v, out, lse, cu_q, cu_k, alibi_slopes, sinks = ctx.saved_tensors
    max_q, max_k, causal, scale = ctx.args
    if dout is None:  # only lse feeds the loss: a stride-0 zero dout
        dout = out.new_zeros(()).expand_as(out)
    args = (dout, dlse, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, *ctx.variants, alibi_slopes,
            sinks, ctx.deterministic)
    if dispatcher_free(dout, dlse, q, k, v, out, lse, cu_q, cu_k, alibi_slopes, sinks):
        dq, dk, dv, dsinks = _bwd_impl(*args)
    else:
        dq, dk, dv, dsinks = torch.ops.diyflash.attention_varlen_bwd(*args)
    return (dq, dk, dv, None, None, None, None, None, None, None, None, None, None,
            dsinks if sinks is not None else None, None)


attention_varlen_fwd.register_autograd(_backward, setup_context=_setup_context)
guard_autograd(attention_varlen_fwd)
guard_autograd(attention_varlen_bwd)
register_autocast(attention_varlen_fwd, cast=("q", "k", "v"))
register_autocast(attention_varlen_bwd, cast=("dout", "q", "k", "v", "out"))


class _EagerAttentionVarlen(torch.autograd.Function):
    """diyflash::attention_varlen_fwd under eager autograd without the dispatcher, as ops/attention.py's
    _EagerAttention is for the dense op: the same implementation, setup_context and backward formula (the
    same saved tensors, kernels and bits; a double backward meets the same refusal), minus the custom op's
    dispatch and generated autograd wrapper. A forward whose q, k or v need gradients has the backward's
    kernels compile ahead (_fwd_impl's backward), which the op's implementation cannot do: inside it a call
    under torch.no_grad() looks the same. Only call_attention_varlen uses it, where dispatcher_free(...,
    autograd=True) holds. Takes attention_varlen_fwd's arguments; returns (out, lse)."""

    @staticmethod
    def forward(ctx, *args):
        out, lse = _fwd_impl(*args[:-1], backward=any(ctx.needs_input_grad[:3]), deterministic=args[-1])
        _setup_context(ctx, args, (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)


_lib = Library(NAMESPACE, "FRAGMENT")
_lib.define(_ATTN.schema)


def _attention_varlen_composite(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                                scale=None, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                                sinks=None, deterministic=None):
    refuse_forward_ad("attention_varlen", q, k, v, sinks)
    return torch.ops.diyflash.attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   causal, scale, window_left, window_right, softcap, alibi_slopes,
                                                   sinks, deterministic)[0]


_lib.impl(_ATTN.name, _attention_varlen_composite, "CompositeImplicitAutograd")


def call_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, scale=None, window_left=-1,
                          window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, return_lse=False,
                          deterministic=None):
    """diyflash::attention_varlen (attention_varlen_fwd with return_lse) for the Python API: the forward
    implementation itself where nothing (tracer, mode, subclass, autograd) could tell it from the op; with
    autograd, _EagerAttentionVarlen (attention_varlen_fwd's autograd formula in a plain autograd.Function);
    else the op through the dispatcher."""
    refuse_forward_ad("attention_varlen", q, k, v, sinks)
    tensors = (q, k, v, cu_q, cu_k, alibi_slopes, sinks)
    if dispatcher_free(*tensors):
        out, lse = _fwd_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window_left, window_right, softcap,
                             alibi_slopes, sinks)
        return (out, lse) if return_lse else out
    args = (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window_left, window_right, softcap, alibi_slopes, sinks,
            deterministic)
    if dispatcher_free(*tensors, autograd=True):
        out, lse = _EagerAttentionVarlen.apply(*args)
        return (out, lse) if return_lse else out
    if return_lse:
        return tuple(torch.ops.diyflash.attention_varlen_fwd(*args))
    return torch.ops.diyflash.attention_varlen(*args)
