"""Checks the ops make of their own inputs, for callers of torch.ops.diyflash.* that skip the API's.

The fakes run them too, so a compiled or exported graph fails at trace time, not inside a kernel.
"""

from __future__ import annotations

import torch

from ..kernels.contract import kvcache_capacity  # noqa: F401  (the API's and the ops' capacity rule)
from .rules import softcap_error


def one_device(op: str, **tensors: torch.Tensor | None) -> None:
    """Every given tensor on one device. The dispatcher picks one backend for a call with tensors on
    several (CUDA over CPU, Meta over both): without this check a kernel read another device's memory
    through a pointer (Triton's interpreter silently read a meta tensor's missing data)."""
    devices = [t.device for t in tensors.values() if t is not None]
    if devices.count(devices[0]) == len(devices):  # under 1 us: the ops pay it per eager call
        return
    listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items() if t is not None)
    raise ValueError(f"diyflash::{op}: inputs must be on one device, got {listed}")


# What the ops compute: fp16, bf16 and fp32 on every path; fp64 on the PyTorch path (for gradcheck).
OP_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 256
INT32_MAX = 2**31 - 1


def check_dtype(op: str, **tensors: torch.Tensor) -> None:
    """A dtype the kernels compute. Without it the PyTorch path computed int, bool, fp8 and complex
    inputs and truncated them (complex lost its imaginary part), and the interpreter crashed."""
    for name, t in tensors.items():
        if t.dtype not in OP_DTYPES:
            raise TypeError(f"diyflash::{op}: Unsupported dtype {t.dtype} for {name}: supported are "
                            "torch.float16, torch.bfloat16, torch.float32 (and torch.float64, PyTorch path)")


def head_dim_error(head_dim: int) -> str | None:
    """The one head_dim rule (the ops, the API, the selector and the CLIs say it alike): None when the
    kernels support head_dim, else the sentence saying why not."""
    if head_dim % 8 != 0 or not 8 <= head_dim <= MAX_HEAD_DIM:
        return f"Unsupported head_dim {head_dim}: supported are multiples of 8 from 8 to {MAX_HEAD_DIM}"
    return None


def check_head_dim(op: str, head_dim: int) -> None:
    error = head_dim_error(head_dim)
    if error:
        raise ValueError(f"diyflash::{op}: {error}")


def seq_lens_error(seq_lens: torch.Tensor, batch: int, device: torch.device) -> tuple[type, str] | None:
    """The one seq_lens rule (the ops, their fakes and the API say it alike): None when seq_lens is (batch,)
    int32 or int64 on the inputs' device, or on the CPU beside CUDA inputs (its few integers are then
    moved), else (exception type, sentence). Any other device was read as if it were the inputs' (a meta
    seq_lens gave uninitialised memory as lengths). The values are the kernels' to clamp to [0, N_k]; the
    API checks them besides (validate)."""
    if seq_lens.dtype not in (torch.int32, torch.int64):
        return TypeError, f"seq_lens must be int32 (or int64), got {seq_lens.dtype}"
    if tuple(seq_lens.shape) != (batch,):
        return ValueError, f"seq_lens must have shape (batch,) = ({batch},), got {tuple(seq_lens.shape)}"
    if seq_lens.device != device and not (seq_lens.device.type == "cpu" and device.type == "cuda"):
        return ValueError, (f"seq_lens must be on the inputs' device {device} (or on the CPU beside CUDA "
                            f"inputs), got {seq_lens.device}")
    return None


def check_seq_lens(op: str, seq_lens: torch.Tensor | None, batch: int, device: torch.device) -> None:
    error = None if seq_lens is None else seq_lens_error(seq_lens, batch, device)
    if error:
        raise error[0](f"diyflash::{op}: {error[1]}")


def attention_shape_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """The one rule for q, k, v shapes (the ops and the API say it alike): None when they fit, else the
    sentence saying why not. 4-D: q (B, H, N_q, D), k (B, H_kv, N_k, D), v (B, H_kv, N_k, D_v) with
    H_kv dividing H (GQA/MQA); 3-D: (BH, N, D) with one head per slice."""
    qs, ks, vs = q.shape, k.shape, v.shape  # each .shape and .dim() is a call into torch: read them once

    def shapes():  # only for a message: formatting it costs microseconds a call
        return f"q {tuple(qs)}, k {tuple(ks)}, v {tuple(vs)}"

    rank = len(qs)
    if rank not in (3, 4) or len(ks) != rank or len(vs) != rank:
        return f"Expected 3D or 4D tensors of the same rank, got {shapes()}"
    if ks[0] != qs[0] or vs[0] != qs[0]:
        return f"Incompatible shapes {shapes()}: the batch (dim 0) must match"
    if ks[-1] != qs[-1]:
        return f"Incompatible shapes {shapes()}: q and k must have the same head_dim"
    if vs[:-1] != ks[:-1]:
        return f"Incompatible shapes {shapes()}: v must have k's batch, heads and length (its head_dim may differ)"
    if rank == 4:
        h, h_kv = qs[1], ks[1]
        if h_kv == 0 or h % h_kv:
            return (f"Incompatible shapes {shapes()}: the number of query heads ({h}) must be a multiple of the "
                    f"number of kv heads ({h_kv})")
    for name, d in (("q/k", qs[-1]), ("v", vs[-1])):
        error = head_dim_error(d)
        if error:
            return f"{error} ({name} head_dim)"
    return None


def check_attention_shapes(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    error = attention_shape_error(q, k, v)
    if error:
        raise ValueError(f"diyflash::{op}: {error}")


def variant_error(q: torch.Tensor, window_left, window_right, softcap, alibi_slopes, sinks,
                  packed_batch: int | None = None) -> tuple[type, str] | None:
    """The one rule for the variant arguments (the ops and the API say it alike): None when they are
    valid, else (exception type, sentence). alibi_slopes: (H,) or (B, H); sinks: (H,); both fp32 (fp64
    beside fp64 inputs) on q's device, and need 4-D inputs, whose dim 1 says H. packed_batch: q holds
    packed sequences (T, H, D), this many of them (the B of (B, H) slopes)."""
    for name, side in (("window left", window_left), ("window right", window_right)):
        if isinstance(side, bool) or not isinstance(side, (int, torch.SymInt)):
            return TypeError, f"{name} must be an int, got {type(side).__name__} {side!r}"
        if side < -1:
            return ValueError, f"{name} must be -1 (unbounded) or >= 0, got {side}"
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, torch.SymFloat)):
        return TypeError, f"softcap must be a float, got {type(softcap).__name__} {softcap!r}"
    error = softcap_error(softcap)
    if error:
        return ValueError, error
    if alibi_slopes is None and sinks is None:  # the usual call: nothing below to check
        return None
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    heads = q.shape[1] if q.dim() == 4 or packed_batch is not None else None
    batch = q.shape[0] if packed_batch is None else packed_batch
    for name, t, shapes in (("alibi_slopes", alibi_slopes, ((heads,), (batch, heads))),
                            ("sinks", sinks, ((heads,),))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            return TypeError, f"{name} must be a torch.Tensor or None, got {type(t).__name__}"
        if heads is None:
            return ValueError, f"{name} needs 4-D inputs (B, H, N, D), got q of shape {tuple(q.shape)}"
        if tuple(t.shape) not in shapes:
            wanted = " or ".join(str(s) for s in shapes)
            return ValueError, f"{name} must have shape {wanted}, got {tuple(t.shape)}"
        if t.dtype not in allowed:
            return TypeError, f"{name} must be float32, got {t.dtype}"
        if t.device != q.device:
            return ValueError, f"{name} must be on the inputs' device {q.device}, got {t.device}"
    return None


def check_variants(op: str, q: torch.Tensor, window_left, window_right, softcap, alibi_slopes, sinks,
                   packed_batch: int | None = None) -> None:
    error = variant_error(q, window_left, window_right, softcap, alibi_slopes, sinks, packed_batch)
    if error:
        kind, message = error
        raise kind(f"diyflash::{op}: {message}")


MAX_DIAGONAL_OFFSET = 2**30  # the kernels' positions are 32-bit: |offset| + N_q + N_k must fit


def check_offset(op: str, diagonal_offset, alibi_slopes) -> None:
    """The diagonal offset of the dense ops (contract.band; the schema makes it an int): within +-2^30;
    not beside ALiBi, whose distance the kernels keep bottom-right aligned (the band absorbs the offset;
    ALiBi's bias would not)."""
    if not -MAX_DIAGONAL_OFFSET <= diagonal_offset <= MAX_DIAGONAL_OFFSET:
        raise ValueError(f"diyflash::{op}: diagonal_offset must be within +-{MAX_DIAGONAL_OFFSET}, got {diagonal_offset}")
    if diagonal_offset != 0 and alibi_slopes is not None:
        raise NotImplementedError(f"diyflash::{op}: diagonal_offset={diagonal_offset} with alibi_slopes: ALiBi's "
                                  "distances stay aligned bottom-right; pass diagonal_offset=0 with ALiBi")


MAX_PACKED_SEQUENCES = 65535  # the grid's z dimension holds one sequence each


def varlen_error(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> tuple[type, str] | None:
    """The one rule for packed (varlen) shapes: q (T_q, H, D), k (T_k, H_kv, D), v (T_k, H_kv, D_v),
    cu_seqlens_q / _k int32 (B + 1,) with 1 <= B <= 65535 on q's device, max_seqlen_* ints >= 0. The
    values of cu_seqlens are data: the API checks them (validate; cu_seqlens_error on the host)."""
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        return ValueError, f"packed sequences need 3-D (total, heads, head_dim) tensors, got {shapes}"
    if v.shape[:-1] != k.shape[:-1]:
        return ValueError, f"Incompatible shapes {shapes}: v must have k's tokens and heads"
    if k.shape[-1] != q.shape[-1]:
        return ValueError, f"Incompatible shapes {shapes}: q and k must have the same head_dim"
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return ValueError, (f"Incompatible shapes {shapes}: the number of query heads ({q.shape[1]}) must be a "
                            f"multiple of the number of kv heads ({k.shape[1]})")
    for name, d in (("q/k", q.shape[-1]), ("v", v.shape[-1])):
        error = head_dim_error(d)
        if error:
            return ValueError, f"{error} ({name} head_dim)"
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            return TypeError, f"{name} must be a torch.Tensor, got {type(cu).__name__}"
        if cu.dtype != torch.int32:
            return TypeError, f"{name} must be int32, got {cu.dtype}"
        if cu.dim() != 1 or not 2 <= cu.shape[0] <= MAX_PACKED_SEQUENCES + 1:
            return ValueError, (f"{name} must have shape (B + 1,) with 1 <= B <= {MAX_PACKED_SEQUENCES}, "
                                f"got {tuple(cu.shape)}")
        if cu.device != q.device:
            return ValueError, f"{name} must be on the inputs' device {q.device}, got {cu.device}"
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        return ValueError, (f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k {tuple(cu_seqlens_k.shape)} "
                            "must describe the same number of sequences")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, (int, torch.SymInt)):
            return TypeError, f"{name} must be an int, got {type(m).__name__} {m!r}"
        if m < 0:
            return ValueError, f"{name} must be >= 0, got {m}"
    return None


def check_varlen(op: str, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> None:
    error = varlen_error(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if error:
        kind, message = error
        raise kind(f"diyflash::{op}: {message}")


def cu_seqlens_error(cu: torch.Tensor, name: str, total: int, max_seqlen: int) -> str | None:
    """The values of one cu_seqlens, checked on the host (validate="sync", or CPU tensors; one device sync for
    CUDA ones; kernels/value_checks.py checks the same rule on the device): cu[0] = 0, non-decreasing,
    cu[-1] = total (every token belongs to a sequence), and no sequence longer than max_seqlen (the grid
    covers max_seqlen rows: a longer one would leave rows unwritten)."""
    lens = cu[1:] - cu[:-1]
    first, last, shortest, longest = torch.stack([cu[0], cu[-1], lens.min(), lens.max()]).tolist()
    if first != 0:
        return f"{name}[0] must be 0, got {first}"
    if shortest < 0:
        i = int((lens < 0).nonzero()[0, 0])
        return f"{name} must be non-decreasing, got {name}[{i}] = {int(cu[i])} > {name}[{i + 1}] = {int(cu[i + 1])}"
    if last != total:
        return f"{name}[-1] must equal the number of tokens ({total}), got {last}"
    if longest > max_seqlen:
        return f"a sequence of {name} has {longest} tokens, more than max_seqlen ({max_seqlen})"
    return None


MAX_KVCACHE_ROWS = 65535
MAX_KVCACHE_NEW = 16 * 65535


def kvcache_error(q, k_cache, v_cache, cache_seqlens, k, v, block_table, num_splits,
                  cache_leftpad=None) -> tuple[type, str] | None:
    """The one rule for KV-cache shapes: q (B, H, N_q, D); a cache (B, H_kv, N_cache, D) / (B, H_kv,
    N_cache, D_v), or paged (num_pages, H_kv, page_size, D) with page_size a multiple of 16 and block_table
    int32 (B, max_pages); cache_seqlens and cache_leftpad int32 (B,); k and v (B, H_kv, N_new, D / D_v) both
    or neither; every tensor on q's device, q, caches and new keys of one dtype."""
    qs, ks, vs = q.shape, k_cache.shape, v_cache.shape  # each .shape and .dim() is a call into torch: read them once
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        return ValueError, f"q, k_cache and v_cache must be 4-D, got q {tuple(qs)}, k_cache {tuple(ks)}, v_cache {tuple(vs)}"
    b, h, _, d = qs
    caches = lambda: f"k_cache {tuple(ks)}, v_cache {tuple(vs)}"  # noqa: E731  (built on error only)
    if ks[:3] != vs[:3]:
        return ValueError, f"Incompatible caches {caches()}: v_cache must have k_cache's first three dims"
    if ks[3] != d:
        return ValueError, f"Incompatible shapes q {tuple(qs)}, {caches()}: q and k_cache must have one head_dim"
    h_kv = ks[1]
    if h_kv == 0 or h % h_kv:
        return ValueError, (f"Incompatible shapes q {tuple(qs)}, {caches()}: the number of query heads ({h}) "
                            f"must be a multiple of the number of kv heads ({h_kv})")
    for name, dim in (("q/k", d), ("v", vs[3])):
        error = head_dim_error(dim)
        if error:
            return ValueError, f"{error} ({name} head_dim)"
    if block_table is None:
        if ks[0] != b:
            return ValueError, f"k_cache must have q's batch {b} in dim 0 (or be paged with a block_table), got {caches()}"
    else:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            return TypeError, f"block_table must be an int32 tensor, got {getattr(block_table, 'dtype', block_table)}"
        if block_table.dim() != 2 or block_table.shape[0] != b:
            return ValueError, f"block_table must have shape ({b}, max_pages), got {tuple(block_table.shape)}"
        if ks[2] % 16 or ks[2] == 0:
            return ValueError, f"page_size (k_cache.shape[2]) must be a positive multiple of 16, got {ks[2]}"
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
        return TypeError, f"cache_seqlens must be an int32 tensor, got {getattr(cache_seqlens, 'dtype', cache_seqlens)}"
    if cache_seqlens.shape != (b,):
        return ValueError, f"cache_seqlens must have shape ({b},), got {tuple(cache_seqlens.shape)}"
    if cache_leftpad is not None:
        if not isinstance(cache_leftpad, torch.Tensor) or cache_leftpad.dtype != torch.int32:
            return TypeError, f"cache_leftpad must be an int32 tensor, got {getattr(cache_leftpad, 'dtype', cache_leftpad)}"
        if cache_leftpad.shape != (b,):
            return ValueError, f"cache_leftpad must have shape ({b},), got {tuple(cache_leftpad.shape)}"
    if qs[2] > MAX_KVCACHE_ROWS:  # (the decode grid holds the rows' tiles on an axis CUDA caps at 65535)
        return ValueError, f"q may have at most {MAX_KVCACHE_ROWS} query rows (N_q) a KV-cache call, got {qs[2]}"
    if (k is None) != (v is None):
        return ValueError, "k and v must be given together (the new keys and values), or neither"
    if k is not None:
        if k.dim() != 4:
            return ValueError, f"k and v must be 4-D (B, H_kv, N_new, D), got k {tuple(k.shape)}, v {tuple(v.shape)}"
        if k.shape[2] > MAX_KVCACHE_NEW:  # the append's grid: blocks of 16 new keys on an axis capped at 65535
            return ValueError, f"k and v may hold at most {MAX_KVCACHE_NEW} new keys a call, got {k.shape[2]}"
        want_k = (b, h_kv, k.shape[2], d)
        want_v = (b, h_kv, k.shape[2], vs[3])
        if k.shape != want_k or v.shape != want_v:
            return ValueError, (f"k and v must have shapes {want_k} and (B, H_kv, N_new, D_v) = {want_v}, got "
                                f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    dtype, device = q.dtype, q.device
    tensors = dict(k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    for name, t in tensors.items():
        if t is not None and t.dtype != dtype:
            return TypeError, f"{name} must have q's dtype {dtype}, got {t.dtype}"
    for name, t in dict(tensors, cache_seqlens=cache_seqlens, block_table=block_table, cache_leftpad=cache_leftpad).items():
        if t is not None and t.device != device:
            return ValueError, f"{name} must be on q's device {device}, got {t.device}"
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= 1024:
        return ValueError, f"num_splits must be an int in [0, 1024] (0 = chosen from the shapes), got {num_splits!r}"
    return None


def check_kvcache(op: str, *args) -> None:
    error = kvcache_error(*args)
    if error:
        kind, message = error
        raise kind(f"diyflash::{op}: {message}")


def kvcache_values_error(cache_seqlens, n_new: int, capacity: int, block_table, num_pages: int,
                         cache_leftpad=None) -> str | None:
    """The values, checked on the host (validate="sync", or CPU tensors; one device sync for CUDA ones;
    kernels/value_checks.py checks the same rules on the device): 0 <= cache_seqlens[b] and cache_seqlens[b] + N_new <=
    the capacity; 0 <= cache_leftpad[b] <= cache_seqlens[b] + N_new; every block_table entry a page of the
    first cache_seqlens[b] + N_new keys uses in [0, num_pages)."""
    if cache_seqlens.numel() == 0:
        return None
    ends = cache_seqlens.to(torch.long) + n_new
    checks = [cache_seqlens.min(), ends.max()]
    pages_at = starts_at = None  # where their checks sit in `checks`, if made
    if block_table is not None and block_table.numel():
        page_size = capacity // block_table.shape[1]
        used = torch.arange(block_table.shape[1], device=ends.device).view(1, -1) * page_size < ends.view(-1, 1)
        bad = used & ((block_table < 0) | (block_table >= num_pages))
        pages_at = len(checks)
        checks.append(bad.any())
    if cache_leftpad is not None:
        starts = cache_leftpad.to(torch.long)
        bad_start = (starts < 0) | (starts > ends)
        starts_at = len(checks)
        checks.append(bad_start.any())
    values = torch.stack([c.to(torch.long) for c in checks]).tolist()
    if values[0] < 0:
        i = int((cache_seqlens < 0).nonzero()[0, 0])
        return f"cache_seqlens must be >= 0, got cache_seqlens[{i}] = {int(cache_seqlens[i])}"
    if values[1] > capacity:
        i = int((ends > capacity).nonzero()[0, 0])
        return (f"cache_seqlens[{i}] + N_new = {int(ends[i])} exceeds the cache's capacity ({capacity} keys)")
    if pages_at is not None and values[pages_at]:
        b, p = (int(x) for x in bad.nonzero()[0])
        return f"block_table[{b}, {p}] = {int(block_table[b, p])} is not a page of the cache (0..{num_pages - 1})"
    if starts_at is not None and values[starts_at]:
        i = int(bad_start.nonzero()[0, 0])
        return (f"cache_leftpad[{i}] = {int(starts[i])} must be in [0, cache_seqlens[{i}] + N_new = {int(ends[i])}] "
                f"(the first key of batch {i})")
    return None
