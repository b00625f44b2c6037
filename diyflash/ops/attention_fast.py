"""The API's fast path for an attention call it has seen before: one dictionary lookup on a cheap key.

`diyflash.flash_attention` without seq_lens, ALiBi or sinks spends most of a short call's host time
deriving the same things again: its argument checks, the variant, the tiles, the launcher's plan key.
All of them are functions of the call's layout (shapes, strides, dtypes, devices, 16-byte alignment)
and its scalar arguments, so a call whose `fast_key` was seen before, and which then passed the checks
and left a plan, goes straight to that plan (kernels' FastForward): out and lse are allocated and the
bound launches run, nothing else. Where the plan cannot run (another current device, changed JIT knobs),
or where no plan exists (the interpreter, very large batches), the ordinary path runs.

A call on the decode route (a few query rows: launch.decode_route), which has no dense plan, has a key
without the keys' length and the caches' strides (a DynamicCache is one token longer, with new strides,
every step; the argument rules do not depend on them beyond k and v having one length): a known one skips the
argument checks and the op layers: the caches' layout of the call before (the layers of one decode step share
it) replays its KV-cache plan with its arguments (kernels' FastKV), any other layout goes to the launcher the
ordinary path ends in (kernels.attention_fwd, whose KV-cache plans are keyed on those lengths' classes).

`flash_attention_with_kvcache` without new keys, ALiBi or sinks (a decode step against a cache of fixed
layout) has the same path: its plan and its launches' arguments (kernels' FastKV), whose decode launch
checks the values where `validate=True` asks (the plan was made so).

The same conditions as the ordinary path's shortcuts decide the route (ops/eager.py): without autograd
the plan alone; with autograd the plan's out and lse given the C++ module's autograd node (kernels/_cplan.cpp
`Attention`: its backward runs the backward's kept C++ call without Python, else `_node_backward`, the
attention's autograd formula), or `_FastEagerAttention` (the same formula as a Python Function) until that
module is loaded; anything a tracer, mode or subclass could see takes the ordinary path, which dispatches
the op. Results are bit-identical to the ordinary path's
(tests/test_attention_fast.py on the GPU).
"""

from __future__ import annotations

import weakref

import torch
import torch.autograd.forward_ad as forward_ad

from ..kernels import uses_triton
from ..kernels._cplan import node_module as cplan_node_module
from ..kernels._runtime import PLAIN, keep, remember
from ..kernels.contract import few_query_rows
from .attention import (attention_backward, attention_fwd_impl, kernels_module, resolve_deterministic, resolve_scale,
                        setup_context)
from .eager import DIRECT, DIRECT_WITH_AUTOGRAD, PLAIN_TYPES, dispatcher_free, eager_route, op_observed

_FAST: dict = {}  # fast_key -> (FastForward, causal, sm_scale, left, right, softcap, return_lse, deterministic),
# or, for a decode key (_DECODE first), _Decode; None: no plan
_FAST_KV: dict = {}  # kv_fast_key -> FastKV (its decode launch checks the values where validate=True), or None
keep("attention fast calls", lambda: (_FAST, _FAST_KV))


def _keyable(causal, sm_scale, window_size, softcap, return_lse, tensors: tuple, optional: tuple = ()) -> bool:
    """Whether a call may have a fast key at all: not under DIYFLASH_PLAIN, its flags and scalars of the
    defaults' types (causal=1 equals True as a key, but the API refuses it; [l, r] is not a window), every
    tensor given a plain torch.Tensor (subclasses and fake tensors have no data pointer and must see the
    op; `optional` ones may also be None), no forward-mode tangents and no functorch transform (its
    wrapped tensors look plain but have no data pointer either)."""
    if (PLAIN or type(causal) is not bool or type(return_lse) is not bool or type(softcap) is not float
            or not (sm_scale is None or type(sm_scale) is float) or type(window_size) is not tuple
            or len(window_size) != 2 or type(window_size[0]) is not int or type(window_size[1]) is not int
            or forward_ad._current_level >= 0 or torch._C._functorch.peek_interpreter_stack() is not None):
        return False
    for t in tensors:  # (loops, not any() over a generator: this runs on every call)
        if type(t) not in PLAIN_TYPES:
            return False
    for t in optional:
        if t is not None and type(t) not in PLAIN_TYPES:
            return False
    return True


def fast_key(q, k, v, causal, sm_scale, window_size, softcap, return_lse, deterministic=None) -> tuple | None:
    """The key of a flash_attention call without seq_lens, ALiBi or sinks: everything its checks and its
    plan depend on. None where the call may not take the fast path (_keyable), or takes the decode route."""
    if (not (deterministic is None or deterministic is True or deterministic is False)
            or not _keyable(causal, sm_scale, window_size, softcap, return_lse, (q, k, v))):
        return None
    try:
        q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
        if few_query_rows(q_shape, k_shape):  # the decode route: its key leaves out what grows with a cache
            if len(v_shape) != 4 or k_shape[2] != v_shape[2]:
                return None  # (the ordinary path says what is wrong)
            return (_DECODE, q_shape, q.stride(), k_shape[:2], k_shape[3], v_shape[:2], v_shape[3], q.dtype, k.dtype,
                    v.dtype, q.device, k.device, v.device, causal, sm_scale, window_size, softcap, return_lse,
                    deterministic)
        return (q_shape, q.stride(), k_shape, k.stride(), v_shape, v.stride(), q.dtype, k.dtype, v.dtype,
                q.device, k.device, v.device, (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16 == 0,
                causal, sm_scale, window_size, softcap, return_lse, deterministic)
    except RuntimeError:  # a tensor without strides or data (nested, ...): the ordinary path explains
        return None


_DECODE = "decode"  # the first element of a decode-route key (a dense key starts with q's shape)


class _Decode:
    """A known decode-route call: the arguments the ordinary path handed the launcher (scale resolved), and
    the device it ran on (None: the CPU under the interpreter), which must be current (its device_guard).
    On CUDA it keeps the FastKV (kernels.fast_kvcache: the KV-cache plan with its launches' arguments) of the
    latest caches' layout: the layers of one decode step attend to caches of one length and strides, so all
    but the first replay it; the first grows the step before's (FastKV.grown: the C++ call of this or an
    earlier step whose lengths' int classes and split count are this one's, in `family`, with this step's
    launch scalars), else looks its plan up (fast_kvcache); a layout whose class has no plan yet runs the
    launcher, which makes one."""

    __slots__ = ("device", "causal", "scale", "window", "softcap", "return_lse", "last", "family")

    def __init__(self, device: int | None, causal: bool, scale: float, window: tuple[int, int], softcap: float,
                 return_lse: bool):
        self.device, self.causal, self.scale, self.window = device, causal, scale, window
        self.softcap, self.return_lse = softcap, return_lse
        self.last = None  # (the caches' layout, its FastKV)
        self.family = {}  # the FastKVs fast_kvcache made for this caller, by kin (FastKV.join)

    def __call__(self, q, k, v):
        # dispatcher_free's conditions but the tensors' types, which fast_key checked (_keyable)
        if op_observed() or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
            return None
        if self.device is not None:
            if torch._C._cuda_getDevice() != self.device:  # (torch.cuda.current_device() less its lazy init)
                return None
            layout = (q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, k.shape[2], k.stride(), v.stride())
            last = self.last
            if last is None or last[0] != layout:
                fast = None
                if last is not None and last[0][:3] == layout[:3]:  # the step before's, grown (its C++ call)
                    fast = last[1].grown(q, k, v, self.causal, self.window, self.family)
                if fast is None:
                    fast = kernels_module().fast_kvcache(q, k, v, None, None, None, self.causal, self.scale,
                                                         self.window, self.softcap, 0, self.return_lse)
                    if fast is not None:
                        fast.join(self.family)
                last = self.last = None if fast is None else (layout, fast)
            if last is not None:
                result = last[1](q, k, v, None, None, None)
                if result is not None:
                    return result if self.return_lse else result[0]
        out, lse = kernels_module().attention_fwd(q, k, v, self.causal, self.scale, None, window=self.window,
                                                  softcap=self.softcap, need_lse=self.return_lse, keep_scratch=True)
        return (out, lse) if self.return_lse else out


def call_fast(key: tuple, q, k, v):
    """The call's result by its plan, or None where the ordinary path must run (an unknown key, a key
    without a plan, a tracer, mode or autocast that must see the op; fast_key refused tangents)."""
    entry = _FAST.get(key)
    if entry is None:
        return None
    if key[0] is _DECODE:
        return entry(q, k, v)
    fast, causal, sm_scale, left, right, softcap, return_lse, deterministic = entry
    route = eager_route(q, k, v)
    if route == DIRECT:
        result = fast(q, k, v, need_lse=return_lse)
    elif route == DIRECT_WITH_AUTOGRAD:
        result = _with_autograd(fast, q, k, v, causal, sm_scale, left, right, softcap, deterministic)
    else:
        return None
    if result is None:
        return None
    return result if return_lse else result[0]


def remember_fast(key: tuple, q, k, v, causal: bool, sm_scale: float | None, left: int, right: int,
                  softcap: float, return_lse: bool, deterministic: bool | None = None) -> None:
    """After the ordinary path ran a call of this key (its checks passed): keep its plan for the next
    call of the key, or None where it has none (so that later calls do not look again)."""
    if key in _FAST:
        return
    if key[0] is _DECODE:  # (the ordinary path ran the decode route: attention_fwd_impl)
        remember(_FAST, key, _Decode(q.get_device() if q.is_cuda else None, causal,
                                     resolve_scale(sm_scale, q.shape[-1]), (left, right), softcap, return_lse)
                 if uses_triton(q) else None)
        return
    fast = None
    if q.is_cuda:
        fast = kernels_module().fast_forward(q, k, v, causal, resolve_scale(sm_scale, q.shape[-1]), (left, right),
                                             softcap)
    remember(_FAST, key, None if fast is None else (fast, causal, sm_scale, left, right, softcap, return_lse,
                                                    deterministic))


def _with_autograd(fast, q, k, v, causal, sm_scale, left, right, softcap, deterministic):
    """The forward under autograd: the plan's out and lse given the C++ module's autograd node (_cplan.cpp
    `Attention`, whose backward runs kept Programs without Python, else `_node_backward`), or, until that module
    is loaded, `_FastEagerAttention`. None where the plan cannot run now."""
    mod = cplan_node_module(_node_backward)
    if mod is None:
        return _FastEagerAttention.apply(fast, q, k, v, causal, sm_scale, left, right, softcap, deterministic)
    if fast.node is None:
        _NODES[fast.node_cache(mod)] = fast
    cache = fast.node[1]
    result = fast(q, k, v)
    if result is None:
        return None
    return mod.attach(q, k, v, *result, cache, fast.node_programs(), causal, sm_scale, left, right, softcap,
                      -1 if deterministic is None else int(deterministic))


_NODES = weakref.WeakValueDictionary()  # a node Cache's id -> its FastForward (while the plan is kept)
keep("attention fast nodes", lambda: (_NODES,))


class _NodeContext:
    """What attention_backward reads of an autograd context, for the C++ node's Python backward."""

    __slots__ = ("saved_tensors", "causal", "scale", "window", "softcap", "offset", "deterministic")

    def __init__(self, saved_tensors, causal, scale, window, softcap, deterministic):
        self.saved_tensors, self.causal, self.scale, self.window = saved_tensors, causal, scale, window
        self.softcap, self.offset, self.deterministic = softcap, 0, deterministic


def _node_backward(dout, dlse, q, k, v, out, lse, cache, causal, scale, left, right, softcap, deterministic):
    """The backward of the C++ node where it ran no kept Program: the FastForward's FastBackward for dout's
    layout (whose Program the node runs from then on: FastBackward.offer), else the autograd formula."""
    ctx = _NodeContext((q, k, v, out, lse, None, None, None), causal, scale, (left, right), softcap, deterministic)
    fast = _NODES.get(cache)
    if fast is None:  # (the plan is gone: clear_caches)
        return attention_backward(ctx, dout, dlse)[:3]
    return _backward(fast, ctx, dout, dlse, offer=True)


def _backward(fast, ctx, dout, dlse, offer: bool = False):
    """dq, dk, dv of a fast-path call: its forward's FastBackward for dout's layout where dlse is None (lse not in
    the loss) and nothing could see the op (ops/eager.py), else the autograd formula, whose plan is then kept
    for the layout (offer: and its Program given to the node's Cache)."""
    layout = None
    if dlse is None and type(dout) in PLAIN_TYPES:  # (a subclass may have no data pointer)
        deterministic = resolve_deterministic(ctx.deterministic)
        layout = (dout.shape, dout.stride(), dout.dtype, dout.data_ptr() % 16 == 0, deterministic)
        replay = fast.backwards.get(layout)
        # q, k, v: the forward's plain tensors (fast_key), out and lse its own: with grad mode off (no
        # double backward) only a mode, tracer or profiler could see the op
        if replay is not None and not torch.is_grad_enabled() and not op_observed():
            q, k, v, out, lse = ctx.saved_tensors[:5]
            grads = replay(dout, q, k, v, out, lse)
            if grads is not None:
                if offer:
                    replay.offer(fast, dout, deterministic)
                return grads
    dq, dk, dv = attention_backward(ctx, dout, dlse)[:3]
    if layout is not None and layout not in fast.backwards:
        q, k, v, out, lse = ctx.saved_tensors[:5]
        remember(fast.backwards, layout, kernels_module().fast_backward(
            dout, q, k, v, out, lse, ctx.causal, resolve_scale(ctx.scale, q.shape[-1]), ctx.window, ctx.softcap,
            deterministic))
    return dq, dk, dv


class _FastEagerAttention(torch.autograd.Function):
    """_EagerAttention (ops/attention.py) with a FastForward as its forward: the same setup_context and
    backward formula, so the same saved tensors and gradients; its backward replays the plan the ordinary
    backward left for dout's layout (`_backward`). The C++ node does the same with less host time; this
    serves until its module is loaded."""

    @staticmethod
    def forward(ctx, fast, q, k, v, causal, sm_scale, left, right, softcap, deterministic):
        result = fast(q, k, v)
        out, lse = result if result is not None else attention_fwd_impl(q, k, v, causal, sm_scale, None, left,
                                                                         right, softcap)
        setup_context(ctx, (q, k, v, causal, sm_scale, None, left, right, softcap, None, None, 0, deterministic),
                      (out, lse))
        ctx.fast = fast
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        # (this runs on autograd's device thread, where the host's work measured twice its cost on the
        # calling thread: bench/results/overhead_h200.jsonl, table "host breakdown")
        return None, *_backward(ctx.fast, ctx, dout, dlse), None, None, None, None, None, None


def _index_layout(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def kv_fast_key(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad, causal, sm_scale, window_size,
                softcap, return_lse, num_splits, validate) -> tuple | None:
    """fast_key for flash_attention_with_kvcache without new keys, ALiBi or sinks: the exact layouts of
    q, the caches and the index tensors (16-byte aligned caches and q only), and the scalar arguments."""
    if (type(num_splits) is not int or not (validate is True or validate is False)
            or not _keyable(causal, sm_scale, window_size, softcap, return_lse, (q, k_cache, v_cache, cache_seqlens),
                            (block_table, cache_leftpad))):
        return None
    try:
        if (q.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr()) % 16:
            return None
        return (q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape, v_cache.stride(), q.dtype,
                k_cache.dtype, v_cache.dtype, q.device, k_cache.device, v_cache.device, _index_layout(cache_seqlens),
                _index_layout(block_table), _index_layout(cache_leftpad), causal, sm_scale, window_size, softcap,
                return_lse, num_splits, validate)
    except RuntimeError:
        return None


def call_kv_fast(key: tuple, q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad):
    """A known decode call's result by its plan (which checks the values where validate=True), or None where
    the ordinary path must run."""
    fast = _FAST_KV.get(key)
    if fast is None or not dispatcher_free(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad):
        return None
    result = fast(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad)
    if result is None:
        return None
    return result if fast.need_lse else result[0]


def remember_kv_fast(key: tuple, q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad, causal: bool,
                     sm_scale: float | None, left: int, right: int, softcap: float, num_splits: int,
                     return_lse: bool, validate: bool) -> None:
    """After the ordinary path ran a decode call of this key: keep its plan and arguments, or None."""
    if key in _FAST_KV:
        return
    fast = None
    if q.is_cuda:
        fast = kernels_module().fast_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad, causal,
                                             resolve_scale(sm_scale, q.shape[-1]), (left, right), softcap, num_splits,
                                             return_lse, check=validate)
    remember(_FAST_KV, key, fast)
