"""The public API: validate, resolve, call the op."""

from __future__ import annotations

import math
import numbers

import torch

from . import ops  # noqa: F401  (registers torch.ops.diyflash.*)
from .ops.attention import call_attention
from .ops.attention_fast import call_fast, call_kv_fast, fast_key, kv_fast_key, remember_fast, remember_kv_fast
from .ops.attention_kvcache import call_attention_with_kvcache
from .ops.attention_varlen import call_attention_varlen
from .ops.matmul import call_matmul
from .ops import runtime
from .ops.runtime import interpreter_active
from .ops.checks import (attention_shape_error, cu_seqlens_error, kvcache_capacity, kvcache_error,
                         kvcache_values_error, one_device, seq_lens_error, variant_error, varlen_error)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _tracing() -> bool:
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _usual(*tensors: torch.Tensor) -> bool:
    """The usual call, checked in one pass: one supported dtype, one CUDA device. Anything else takes
    the full checks below, which explain what is wrong (this only saves their cost, ~3 us a call)."""
    first = tensors[0]
    dtype, index = first.dtype, first.get_device()
    if dtype not in SUPPORTED_DTYPES or index < 0:
        return False
    for t in tensors[1:]:
        if t.dtype != dtype or t.get_device() != index or not t.is_cuda:
            return False
    return first.is_cuda


def _check_dtypes(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"Unsupported dtype {t.dtype} for {name}: supported are torch.float16, torch.bfloat16 and torch.float32"
            )
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        listed = ", ".join(f"{n} {t.dtype}" for n, t in tensors.items())
        raise TypeError(f"dtypes must match, got {listed}")


def _check_devices(**tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        listed = ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
        raise ValueError(f"all inputs must be on the same device, got {listed}")
    device = next(iter(devices))
    if device.type != "cuda" and not interpreter_active():
        raise ValueError(
            f"CUDA tensors required, got tensors on {device}. CPU tensors run the same Triton kernels "
            "under TRITON_INTERPRET=1; torch.ops.diyflash.* also accept CPU tensors (PyTorch path)."
        )


def _value_check(validate, t: torch.Tensor) -> str | None:
    """How the values of an index tensor (lengths, positions, pages) are checked, by the `validate`
    argument: "device" (validate=True on a CUDA tensor: a kernel checks them where they are and stops the
    program on a bad one, with no device sync; kernels/value_checks.py), "sync" (a CPU tensor, where
    reading costs nothing, or validate="sync": checked on the host, ValueError naming the index and the
    value) or None (validate=False; while compiling or exporting, which have no values; validate="sync"
    while a CUDA graph is being captured, which must not sync)."""
    if validate is not True and validate is not False and validate != "sync":
        raise TypeError(f"validate must be True, False or 'sync', got {validate!r}")
    if validate is False or _tracing():
        return None
    if not t.is_cuda:
        return "sync"
    if validate == "sync":
        return None if torch.cuda.is_current_stream_capturing() else "sync"
    return "device"


def _check_seq_lens(seq_lens, batch: int, seq_len_k: int, device: torch.device, validate=True) -> None:
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"seq_lens must be a torch.Tensor of int32 (or int64), got {type(seq_lens).__name__}")
    error = seq_lens_error(seq_lens, batch, device)  # the ops' rule
    if error:
        raise error[0](error[1])
    mode = _value_check(validate, seq_lens)
    if mode is None or seq_lens.numel() == 0:
        # the kernels clamp the lengths to [0, N] either way, so nothing is read out of bounds
        return
    if mode == "device":
        runtime.value_checks().check_seq_lens(seq_lens, seq_len_k)
        return
    bad = (seq_lens <= 0) | (seq_lens > seq_len_k)
    if bool(bad.any()):
        idx = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"seq_lens must satisfy 0 < seq_lens[i] <= seq_len ({seq_len_k}), "
            f"got seq_lens[{idx}] = {int(seq_lens[idx])}"
        )


def _check_bool(name: str, value) -> bool:
    # bool("no") is True: a string, None or a tensor given for a flag is refused, not read as truthy
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _check_deterministic(value) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"deterministic must be a bool or None, got {type(value).__name__} {value!r}")
    return value


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    seq_lens: torch.Tensor | None = None,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
    validate: bool | str = True,
    deterministic: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention softmax(scores) v with O(N) memory, differentiable in q, k, v (and sinks).

    Args:
        q: (batch, heads, seq_len_q, head_dim) or (batch*heads, seq_len_q, head_dim).
        k: (batch, kv_heads, seq_len_k, head_dim), v: (batch, kv_heads, seq_len_k, head_dim_v), or the
            3-D forms with one head per slice. heads must be a multiple of kv_heads (GQA; MQA with one):
            query head h reads kv head h // (heads // kv_heads), and k and v are read in place, never
            repeated. head_dim and head_dim_v are multiples of 8 up to 256 and may differ (MLA: 192/128).
            seq_len_k may differ from seq_len_q. float16, bfloat16 or float32, all three the same dtype,
            on one CUDA device (or CPU under TRITON_INTERPRET=1). Any strides: a (B, H, N, D) view of
            (B, N, H, D) storage is read in place, not copied.
        causal: query i attends to keys j <= i + seq_len_k - seq_len_q (aligned to the bottom-right
            corner, as flash-attn; the usual j <= i when the lengths are equal). A row that sees no
            key outputs 0.
        sm_scale: score scale, default 1 / sqrt(head_dim).
        seq_lens: optional (batch,) int32 (or int64) valid lengths, batch = q.shape[0] (for 3-D inputs
            every row of the leading dim is its own sample), on the inputs' device or on the CPU beside
            CUDA inputs (the ops' rule). Keys at positions >= seq_lens[b] are ignored
            and query rows >= seq_lens[b] output 0. Requires 0 < seq_lens[b] <= seq_len_k, checked
            as `validate` says; the kernels clamp the lengths to [0, seq_len] either way, so nothing
            is read out of bounds.
        window_size: (left, right), -1 for unbounded: query i sees key j iff
            i + off - left <= j <= i + off + right, off = seq_len_k - seq_len_q (bottom-right, as
            causal; causal caps right at 0). Key blocks outside the band are skipped.
        softcap: > 0 caps the scores: s = softcap * tanh(s / softcap) (Gemma 2). 0 is off.
        alibi_slopes: fp32 (heads,) or (batch, heads), not differentiable: s -= slope * |i + off - j|.
        sinks: fp32 (heads,), differentiable: one extra logit per head in the softmax denominator that
            carries no value (gpt-oss).
        return_lse: also return lse (batch, heads, seq_len_q) fp32, the natural-log normalizer (the sink
            included): -inf for a row that sees no key (the sink itself with sinks) and for padding rows.
            Differentiable.
        validate: how seq_lens' values are checked. True: on CUDA by a small kernel queued before the
            attention, with no device sync (a bad value stops the program with a device-side assert
            naming the rule, as PyTorch's indexing does; the CUDA context is then lost), on the CPU on
            the host. "sync": on the host, a ValueError naming the index and the value, at the cost of
            one device sync (skipped while a CUDA graph is captured). False: not checked. Never while
            compiling or exporting.
        deterministic: the backward's mode, as PyTorch's SDPA and flash-attn have it. True: bitwise
            reproducible gradients. False: the faster of two backwards runs; where that is the one-pass
            backward (head_dim 64 from 4096 rows, fp16/bf16, on Hopper), dq is added up with fp32 atomics
            and may differ by a few ulps from run to run (dk and dv never do). None (default): True where
            torch.use_deterministic_algorithms(True) is in force when the backward runs, else False. The
            forward is deterministic either way (docs/api.md, "Determinism").

    Returns:
        The output (..., seq_len_q, head_dim_v) in q's dtype (fp16/bf16 computed natively with fp32
        accumulation, fp32 with fp32-accurate dots), laid out in memory like q; with return_lse,
        (out, lse).

    Raises:
        ValueError: rank not 3 or 4 ("Expected 3D or 4D tensors"), incompatible shapes (heads not a
            multiple of kv_heads), not CUDA ("CUDA tensors required"), different devices, "Unsupported
            head_dim", bad seq_lens, window sides below -1, negative softcap, alibi_slopes or sinks of
            the wrong shape or device.
        TypeError: "Unsupported dtype", "dtypes must match", non-numeric sm_scale, alibi_slopes or sinks
            not float32.
        ModuleNotFoundError: "triton is required" when triton is missing.
    """
    key = None
    if seq_lens is None and alibi_slopes is None and sinks is None and validate is True and not _tracing():
        # a call of a layout seen before goes to its plan directly (ops/attention_fast.py)
        key = fast_key(q, k, v, causal, sm_scale, window_size, softcap, return_lse, deterministic)
        if key is not None:
            out = call_fast(key, q, k, v)
            if out is not None:
                return out
    causal, sm_scale, left, right, softcap = attention_arguments(q, k, v, causal, sm_scale, window_size, softcap,
                                                                 alibi_slopes, sinks, seq_lens=seq_lens,
                                                                 validate=validate)
    deterministic = _check_deterministic(deterministic)
    out = call_attention(q, k, v, causal, sm_scale, seq_lens, left, right, softcap, alibi_slopes, sinks,
                         _check_bool("return_lse", return_lse), deterministic)
    if key is not None:
        remember_fast(key, q, k, v, causal, sm_scale, left, right, softcap, return_lse, deterministic)
    return tuple(out) if return_lse else out


def attention_arguments(q, k, v, causal, sm_scale, window_size, softcap, alibi_slopes, sinks, *, seq_lens=None,
                        any_device: bool = False, validate=True) -> tuple[bool, float | None, int, int, float]:
    """flash_attention's argument rules, which diyflash.distributed applies to every rank's shards too:
    raises what flash_attention documents, else returns (causal, sm_scale, window left, window right,
    softcap) as the ops take them. any_device: CPU tensors without the interpreter too (the ops' PyTorch
    path; the distributed attentions run on gloo's CPU processes). validate: flash_attention's."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"Expected 3D or 4D tensors of the same rank, got q.dim()={q.dim()}, k.dim()={k.dim()}, v.dim()={v.dim()}"
        )
    if not _usual(q, k, v):
        _check_dtypes(q=q, k=k, v=v)
        if any_device:
            one_device("attention", q=q, k=k, v=v)
        else:
            _check_devices(q=q, k=k, v=v)
    shape_problem = attention_shape_error(q, k, v)
    if shape_problem:
        raise ValueError(shape_problem)
    sm_scale = _check_scale(sm_scale)
    if seq_lens is not None:
        _check_seq_lens(seq_lens, q.shape[0], k.shape[-2], q.device, validate)
    else:
        _value_check(validate, q)  # the argument is checked even where no tensor needs it
    left, right, softcap = _check_variant_args(q, window_size, softcap, alibi_slopes, sinks)
    return _check_bool("causal", causal), sm_scale, left, right, softcap


def _check_scale(sm_scale) -> float | None:
    if sm_scale is None:
        return None
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")
    return float(sm_scale)


def _check_variant_args(q, window_size, softcap, alibi_slopes, sinks, packed_batch=None):
    """(left, right, softcap) after the variant rule (ops/checks.variant_error)."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair, got {window_size!r}")
    left, right = window_size
    if isinstance(softcap, numbers.Real) and not isinstance(softcap, bool):
        softcap = float(softcap)
    problem = variant_error(q, left, right, softcap, alibi_slopes, sinks, packed_batch)
    if problem:
        kind, message = problem
        raise kind(message)
    return left, right, softcap


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
    validate: bool | str = True,
    deterministic: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over packed sequences (flash-attn's flash_attn_varlen_func), differentiable in q, k, v
    (and sinks).

    Args:
        q: (total_q, heads, head_dim); k: (total_k, kv_heads, head_dim); v: (total_k, kv_heads,
            head_dim_v): the sequences concatenated token-major, any strides. dtypes, devices, head_dims
            and GQA as flash_attention.
        cu_seqlens_q, cu_seqlens_k: int32 (B + 1,) on the inputs' device, 1 <= B <= 65535: sequence b is
            q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] against k and v[cu_seqlens_k[b]:cu_seqlens_k[b + 1]].
            Sequences of length 0 are allowed (a query row that sees no key outputs 0).
        max_seqlen_q, max_seqlen_k: the longest sequences (Python ints; SymInts under torch.compile). They
            size the launch grid, and nothing is synchronised to learn them.
        causal, sm_scale, window_size, softcap, alibi_slopes, sinks: as flash_attention, applied per
            sequence, aligned bottom-right to the sequence's own lengths. alibi_slopes may be (heads,) or
            (B, heads).
        return_lse: also return lse (heads, total_q) fp32, flash-attn's varlen layout.
        deterministic: the backward's mode, as flash_attention's.

    validate: how the values of cu_seqlens are checked: cu[0] = 0, non-decreasing, cu[-1] = the token
        count, no sequence longer than max_seqlen. True: on CUDA by a small kernel per cu_seqlens queued
        before the attention, with no device sync (a bad value stops the program with a device-side
        assert naming the rule; the CUDA context is then lost), on the CPU on the host. "sync": on the
        host, a ValueError naming the entry and its value, at the cost of one device sync (skipped while
        a CUDA graph is captured). False: not checked (the kernels clamp every offset into the tensors,
        so nothing is read or written out of bounds, but rows of a sequence longer than max_seqlen_q,
        or tokens past cu[-1], are then left unwritten). Never while compiling or exporting.

    Returns:
        (total_q, heads, head_dim_v) in q's dtype; with return_lse, (out, lse).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not _usual(q, k, v):
        _check_dtypes(q=q, k=k, v=v)
        _check_devices(q=q, k=k, v=v)
    problem = varlen_error(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if problem:
        kind, message = problem
        raise kind(message)
    sm_scale = _check_scale(sm_scale)
    left, right, softcap = _check_variant_args(q, window_size, softcap, alibi_slopes, sinks, cu_seqlens_q.shape[0] - 1)
    mode = _value_check(validate, cu_seqlens_q)
    for cu, name, total, longest in ((cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q),
                                     (cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k)):
        if mode == "device":
            runtime.value_checks().check_cu_seqlens(cu, total, longest)
        elif mode == "sync":
            error = cu_seqlens_error(cu, name, total, longest)
            if error:
                raise ValueError(error)
    out = call_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                _check_bool("causal", causal), sm_scale, left, right, softcap, alibi_slopes, sinks,
                                _check_bool("return_lse", return_lse), _check_deterministic(deterministic))
    return tuple(out) if return_lse else out


def flash_attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    block_table: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    causal: bool = False,
    sm_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
    num_splits: int = 0,
    validate: bool | str = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Inference attention against a KV cache (flash-attn's flash_attn_with_kvcache): decoding (N_q = 1),
    speculative decoding and chunked prefill (N_q up to a few hundred). Not differentiable: no backward.

    Args:
        q: (batch, heads, N_q, head_dim), any strides.
        k_cache, v_cache: (batch, kv_heads, N_cache, head_dim[_v]) with any strides (a (B, N_cache, H_kv,
            D) buffer viewed with .transpose(1, 2) is read in place), or paged: (num_pages, kv_heads,
            page_size, head_dim[_v]) with block_table; page_size a multiple of 16. Written in place
            when k and v are given: they must then not overlap in memory, themselves (an expanded view)
            or each other, nor the new k and v (ValueError), and their version counters move as for any
            in-place op. q's dtype.
        cache_seqlens: int32 (batch,): the keys already in the cache. Not modified: the caller advances it.
        k, v: optional (batch, kv_heads, N_new, head_dim[_v]) new keys and values, written into the cache
            at positions cache_seqlens[b] .. + N_new before attending, in the same call.
        block_table: int32 (batch, max_pages): page p of batch b's cache is k_cache[block_table[b, p]].
        cache_leftpad: optional int32 (batch,): batch b's keys start at cache position cache_leftpad[b]
            (a left-padded batch, flash-attn's cache_leftpad): the positions before it are never read.
            The new keys still go at cache_seqlens[b] .. + N_new, and causal, windows and ALiBi count
            positions from 0 as before, so a key's distance to a query is what it was without padding.
        causal, sm_scale, window_size, softcap, alibi_slopes, sinks: as flash_attention; batch b attends to
            its first cache_seqlens[b] + N_new keys, causal and windows aligned bottom-right to that length.
        return_lse: also return lse (batch, heads, N_q) fp32.
        num_splits: how many programs share one (batch, kv head)'s keys (split-KV); 0 chooses from the
            shapes and the GPU's SM count. Results are deterministic for a given split count. Eager CUDA
            calls keep their scratch (split-KV's fp32 partials, an lse not asked for) in buffers held per
            device, stream and thread between calls (B x H x N_q x splits x (D_v + 1) floats at most, the
            largest call's), instead of allocating them every call; a call captured in a CUDA graph, and
            one through the op (torch.compile, export), allocates its own.

        validate: how the values are checked: cache_seqlens >= 0, cache_seqlens + N_new within the
            capacity (N_cache, or max_pages * page_size), 0 <= cache_leftpad <= cache_seqlens + N_new,
            every block_table entry in use a page of the cache. True: on CUDA inside the decode launch
            (or by a small kernel queued before the op where the op is dispatched), with no device sync (a
            bad value stops the program with a device-side assert naming the rule; the CUDA context is then
            lost), on the CPU on the host. "sync": on the host, a ValueError naming the entry and its value,
            at the cost of one device sync (skipped while a CUDA graph is captured). False: not checked.
            Never while compiling or exporting. The kernels clamp either way: positions past the capacity
            are neither written nor read, page entries are clamped into the cache.

    Returns:
        (batch, heads, N_q, head_dim_v) in q's dtype and layout; with return_lse, (out, lse).
    """
    key = None
    if (k is None and v is None and alibi_slopes is None and sinks is None and not _tracing()
            and not torch._C._is_any_autocast_enabled()):
        # a decode step of a layout seen before goes to its plan directly (ops/attention_fast.py)
        key = kv_fast_key(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad, causal, sm_scale,
                          window_size, softcap, return_lse, num_splits, validate)
        if key is not None:
            out = call_kv_fast(key, q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad)
            if out is not None:
                return out
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(q.device.type) and q.dtype != torch.float64:
        # (the first test is one call into torch; reading q.device.type costs ~1 us of the GPU machine's host)
        # the op's autocast casts q, k and v (never the caches it writes); cast here so the checks see that
        dtype = torch.get_autocast_dtype(q.device.type)
        q, k, v = (None if t is None else t.to(dtype) for t in (q, k, v))
    new = {name: t for name, t in (("k", k), ("v", v)) if t is not None}
    if not _usual(q, k_cache, v_cache, *new.values()):
        _check_dtypes(q=q, k_cache=k_cache, v_cache=v_cache, **new)
        _check_devices(q=q, k_cache=k_cache, v_cache=v_cache, **new)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits must be an int, got {type(num_splits).__name__} {num_splits!r}")
    problem = kvcache_error(q, k_cache, v_cache, cache_seqlens, k, v, block_table, num_splits, cache_leftpad)
    if problem:
        kind, message = problem
        raise kind(message)
    sm_scale = _check_scale(sm_scale)
    left, right, softcap = _check_variant_args(q, window_size, softcap, alibi_slopes, sinks)
    mode = _value_check(validate, cache_seqlens)
    if mode == "sync":
        error = kvcache_values_error(cache_seqlens, 0 if k is None else k.shape[2],
                                     kvcache_capacity(k_cache, block_table), block_table, k_cache.shape[0],
                                     cache_leftpad)
        if error:
            raise ValueError(error)
    return_lse = _check_bool("return_lse", return_lse)
    # mode "device": the check runs on the GPU, inside the decode launch where it can (one launch less)
    out, lse = call_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table,
                                           _check_bool("causal", causal), sm_scale, left, right, softcap, alibi_slopes,
                                           sinks, num_splits, cache_leftpad, need_lse=return_lse,
                                           check=mode == "device")
    if key is not None:
        remember_kv_fast(key, q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad, causal, sm_scale, left,
                         right, softcap, num_splits, return_lse, validate)
    return (out, lse) if return_lse else out


def clear_caches() -> None:
    """Forget what diyflash keeps between calls to make them cheap on the host: the attention, KV-cache and
    matmul plans (the launches a call of known shapes replays), the launchers' bound kernels, the kept
    KV-cache decode buffers and this process's matmul tuning choices. Compiled kernels stay in Triton's
    cache and tuned choices in diyflash's disk cache, so the next call recompiles and retunes nothing;
    it only pays the host path once more. For tests, memory accounting and debugging."""
    runtime.clear_caches()


def cache_info() -> dict[str, int]:
    """What clear_caches would forget, by kind: counts, and the kept decode buffers' bytes. Kinds of a part
    not used yet in this process (its module not imported) are absent."""
    return runtime.cache_info()


def triton_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    use_autotune: bool = True,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """C = A @ B with diyflash's Triton kernel, differentiable in a and b.

    Args:
        a: (M, K) and b: (K, N), float16, bfloat16 or float32, the same dtype, on one CUDA device (or CPU
            under TRITON_INTERPRET=1). Any strides: a transposed view (`x.mT`) is read in place, never copied.
        block_m, block_n, block_k: tile sizes; all three or none. Positive powers of two that the kernel
            supports (16..256 for m and n, 16..128 for k) and no larger than the problem padded to a power
            of two. Given, they bypass the autotuner.
        use_autotune: without block sizes, time the candidate tiles once per (dtype, layout, shape bucket)
            and keep the fastest for the process (default); False takes the untuned default tiles.
        allow_tf32: float32 inputs only: use TF32 tensor cores (about 10 mantissa bits) instead of the
            default IEEE fp32 arithmetic.

    Returns:
        (M, N) contiguous, in a's dtype: fp16/bf16 accumulate in fp32; fp32 is fp32-accurate by default
        (the seed computed fp32 inputs in fp16 and returned fp16; diyflash does not).

    Raises:
        ValueError: "Expected 2D tensors", "CUDA tensors required", different devices, "Incompatible
            dimensions", bad block sizes. TypeError: "Unsupported dtype", "dtypes must match".
        ModuleNotFoundError: "triton is required" when triton is missing.
    """
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"Expected 2D tensors, got a.dim()={a.dim()} (shape {tuple(a.shape)}) and "
                         f"b.dim()={b.dim()} (shape {tuple(b.shape)})")
    if not _usual(a, b):
        _check_dtypes(a=a, b=b)
        _check_devices(a=a, b=b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"Incompatible dimensions: a is {tuple(a.shape)} and b is {tuple(b.shape)}, "
                         f"but a.shape[1] ({a.shape[1]}) != b.shape[0] ({b.shape[0]})")
    blocks = None
    if (block_m, block_n, block_k) != (None, None, None):
        # validated here so the error names the arguments; the op validates the same way
        runtime.check_matmul_tiles(block_m, block_n, block_k, a, b)
        blocks = [block_m, block_n, block_k]
    return call_matmul(a, b, blocks, _check_bool("use_autotune", use_autotune), _check_bool("allow_tf32", allow_tf32))
