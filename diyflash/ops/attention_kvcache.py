"""diyflash::attention_with_kvcache: inference attention against a (paged) KV cache, appending in place.

A torch.library.custom_op with mutates_args=("k_cache", "v_cache") (the new keys and values are written
into the caches), an exact fake, autocast, and no autograd: it is an inference op (a backward through a
cache write has no meaning here). CUDA tensors run kernels/attention/decode.py; CPU tensors run the same
kernels under TRITON_INTERPRET=1 and attention_torch.attention_kvcache_torch otherwise.
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from ..kernels import device_guard, uses_triton
from ..kernels.attention_torch import attention_kvcache_torch
from ..kernels.contract import empty_out
from .attention import kernels_module, lse_dtype, prepare_variants, resolve_scale, variant_kwargs
from .autocast import register_autocast
from .checks import check_dtype, check_kvcache, check_variants, kvcache_capacity
from .eager import dispatcher_free
from .forward_ad import guard_autograd
from .registry import entry
from .rules import for_kernels, written_error, written_shape_error
from .runtime import value_checks

_OP = entry("attention_with_kvcache")
OP_NAME = "attention_with_kvcache"


def _check(q, k_cache, v_cache, cache_seqlens, k, v, block_table, window_left, window_right, softcap, alibi_slopes,
           sinks, num_splits, cache_leftpad) -> None:
    check_kvcache(OP_NAME, q, k_cache, v_cache, cache_seqlens, k, v, block_table, num_splits, cache_leftpad)
    check_dtype(OP_NAME, q=q)
    check_variants(OP_NAME, q, window_left, window_right, softcap, alibi_slopes, sinks)
    error = written_shape_error(k_cache, v_cache, k)
    if error:
        raise ValueError(f"diyflash::{OP_NAME}: {error}")


def _impl(q, k_cache, v_cache, cache_seqlens, k=None, v=None, block_table=None, causal=False, scale=None,
          window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, num_splits=0, cache_leftpad=None,
          need_lse=True, keep_scratch=False, check=False):
    """The op's computation. need_lse=False (the API's shortcut, where no caller sees lse) may return lse None;
    keep_scratch=True and check=True (the device-side value check, inside the kernels where they run) from
    that shortcut only (kernels' attention_kvcache says why)."""
    error = written_error(k_cache, v_cache, k, v)  # where they are written: storage addresses, so here
    if error:
        raise ValueError(f"diyflash::{OP_NAME}: {error}")
    scale = resolve_scale(scale, q.shape[-1])
    alibi_slopes, sinks = prepare_variants(alibi_slopes, sinks)
    var = variant_kwargs(window_left, window_right, softcap, alibi_slopes)
    # index tensors with unit strides: B (or B x pages) integers
    cache_seqlens, cache_leftpad, block_table = map(for_kernels, (cache_seqlens, cache_leftpad, block_table))
    if uses_triton(q):
        with device_guard(q):
            return kernels_module().attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal,
                                                      scale, sinks=sinks, num_splits=num_splits,
                                                      cache_leftpad=cache_leftpad, need_lse=need_lse,
                                                      keep_scratch=keep_scratch, check=check, **var)
    if check:
        queue_value_check(q, k_cache, cache_seqlens, k, block_table, cache_leftpad)
    return attention_kvcache_torch(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, scale, sinks=sinks,
                                   cache_leftpad=cache_leftpad, **var)


@custom_op(_OP.qualname, mutates_args=("k_cache", "v_cache"), schema=_OP.signature)
def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k=None, v=None, block_table=None, causal=False,
                           scale=None, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None,
                           num_splits=0, cache_leftpad=None):
    _check(q, k_cache, v_cache, cache_seqlens, k, v, block_table, window_left, window_right, softcap, alibi_slopes,
           sinks, num_splits, cache_leftpad)
    return _impl(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, scale, window_left, window_right,
                 softcap, alibi_slopes, sinks, num_splits, cache_leftpad)


@attention_with_kvcache.register_fake
def _fake(q, k_cache, v_cache, cache_seqlens, k=None, v=None, block_table=None, causal=False, scale=None,
          window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, num_splits=0, cache_leftpad=None):
    _check(q, k_cache, v_cache, cache_seqlens, k, v, block_table, window_left, window_right, softcap, alibi_slopes,
           sinks, num_splits, cache_leftpad)
    return empty_out(q, v_cache.shape[-1]), q.new_empty(q.shape[:-1], dtype=lse_dtype(q.dtype))


guard_autograd(attention_with_kvcache)  # no derivative, forward or reverse: an inference op
register_autocast(attention_with_kvcache, cast=("q", "k", "v"))  # the caches keep their dtype (they are written)


def queue_value_check(q, k_cache, cache_seqlens, k, block_table, cache_leftpad) -> None:
    """Queue the device-side check of cache_seqlens', cache_leftpad's and the block table's values (the
    API's validate=True), as its own launch (value_checks.check_kvcache)."""
    with device_guard(q):
        value_checks().check_kvcache(cache_seqlens, 0 if k is None else k.shape[2],
                                     kvcache_capacity(k_cache, block_table), block_table, k_cache.shape[0],
                                     cache_leftpad)


def call_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, scale, window_left,
                                window_right, softcap, alibi_slopes, sinks, num_splits, cache_leftpad=None,
                                need_lse=True, check=False):
    """The op for the Python API, or its implementation itself where nothing could tell them apart (lse may
    then be None without need_lse). check: the API's device-side value check (validate=True on CUDA tensors),
    inside the decode launch where the implementation runs here, else queued before the op."""
    args = (q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, scale, window_left, window_right, softcap,
            alibi_slopes, sinks, num_splits, cache_leftpad)
    if dispatcher_free(q, k_cache, v_cache, cache_seqlens, k, v, block_table, alibi_slopes, sinks, cache_leftpad):
        result = _impl(*args, need_lse=need_lse, keep_scratch=True, check=check)
        if k is not None:
            # what the op's mutation does through the dispatcher: a tensor autograd saved before this append
            # then refuses to serve a backward, instead of serving the new values
            _bump_version(k_cache)
            _bump_version(v_cache)
        return result
    if check:
        queue_value_check(q, k_cache, cache_seqlens, k, block_table, cache_leftpad)
    return torch.ops.diyflash.attention_with_kvcache(*args)


def _bump_version(t: torch.Tensor) -> None:
    if not t.is_inference():  # an inference tensor keeps no version counter
        torch.autograd.graph.increment_version(t)
