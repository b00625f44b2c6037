"""The API's value checks run on the GPU: lengths, cumulative lengths, KV-cache positions and pages.

Checking a CUDA tensor's values on the host copies them back, and that waits for every kernel queued
before (a device sync), so the host can never run ahead of the GPU. These kernels check the same rules as
ops/checks.py's eager checks (seq_lens in the API, cu_seqlens_error, kvcache_values_error) where the
values are, and stop the program where one fails, as PyTorch's own indexing does: a device-side assert,
whose message names the argument and the rule; the CUDA context is then unusable and the next CUDA
call raises "device-side assert triggered". The launch costs one small kernel and no sync. The
eager checks (`validate="sync"`) name the index and the value instead.

Each rule is one @triton.jit predicate (`*_ok`) beside its kernel, so that a test can run the predicate
under Triton's interpreter, where device_assert does nothing (Triton compiles asserts only with debug on,
which these kernels set for themselves alone).
"""

from __future__ import annotations

import torch

from ._runtime import require_triton

require_triton()  # before anything imports triton: its absence is then the error table's "triton is required"
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ._launch import DirectLauncher  # noqa: E402

BLOCK = 256  # elements a program checks at once; one program loops over any batch


@triton.jit
def seq_lens_ok(lens, n_k):
    """flash_attention's seq_lens: 0 < seq_lens[b] <= seq_len_k."""
    return (lens > 0) & (lens <= n_k)


@triton.jit
def cu_seqlens_ok(first, start, end, is_first, is_last, total, max_seqlen):
    """One sequence of a cu_seqlens: cu[0] = 0, non-decreasing, at most max_seqlen tokens, cu[-1] = the tokens."""
    return ((first == 0) | ~is_first) & (end >= start) & (end - start <= max_seqlen) & ((end == total) | ~is_last)


@triton.jit
def kv_positions_ok(lens, pad, n_new, capacity):
    """One batch row of a KV-cache call: 0 <= cache_seqlens, cache_seqlens + N_new <= the capacity,
    0 <= cache_leftpad <= cache_seqlens + N_new (pad 0 without leftpad)."""
    ends = lens.to(tl.int64) + n_new
    return (lens >= 0) & (ends <= capacity) & (pad >= 0) & (pad <= ends)


@triton.jit
def kv_page_ok(page, page_start, ends, num_pages):
    """A block_table entry: a page of the cache wherever the call uses it (its first key below the row's end)."""
    return (page_start >= ends) | ((page >= 0) & (page < num_pages))


@triton.jit(debug=True)
def _seq_lens_kernel(lens_ptr, stride, batch, n_k, BLOCK: tl.constexpr):
    for start in range(0, batch, BLOCK):
        b = start + tl.arange(0, BLOCK)
        inside = b < batch
        lens = tl.load(lens_ptr + b.to(tl.int64) * stride, mask=inside, other=1)
        tl.device_assert(seq_lens_ok(lens, n_k) | ~inside,
                         "diyflash: seq_lens must satisfy 0 < seq_lens[b] <= seq_len_k (validate='sync' names b)")


@triton.jit(debug=True)
def _cu_seqlens_kernel(cu_ptr, stride, batch, total, max_seqlen, BLOCK: tl.constexpr):
    first = tl.load(cu_ptr)
    for start in range(0, batch, BLOCK):
        b = start + tl.arange(0, BLOCK)
        inside = b < batch
        lo = tl.load(cu_ptr + b.to(tl.int64) * stride, mask=inside, other=0)
        hi = tl.load(cu_ptr + (b + 1).to(tl.int64) * stride, mask=inside, other=0)
        ok = cu_seqlens_ok(first, lo, hi, b == 0, b == batch - 1, total, max_seqlen)
        tl.device_assert(ok | ~inside, "diyflash: cu_seqlens must start at 0, not decrease, end at the token count "
                                       "and hold no sequence longer than max_seqlen (validate='sync' names which)")


@triton.jit
def kvcache_row_check(lens_ptr, pad_ptr, table_ptr, b, lens_stride, pad_stride, table_stride_b, table_stride_p,
                      n_new, capacity, page_size, max_pages, num_pages,
                      HAS_PAD: tl.constexpr, PAGED: tl.constexpr, BLOCK: tl.constexpr):
    """The KV-cache rules of batch row b (int64), device-asserted: its kernel's, and the decode kernel's
    where the API's eager calls fold the check into it (decode.py, CHECK; a kernel compiled with debug)."""
    lens = tl.load(lens_ptr + b * lens_stride)
    pad = tl.load(pad_ptr + b * pad_stride) if HAS_PAD else 0
    tl.device_assert(kv_positions_ok(lens, pad, n_new, capacity),
                     "diyflash: cache_seqlens must be >= 0, cache_seqlens + N_new within the cache's capacity and "
                     "0 <= cache_leftpad <= cache_seqlens + N_new (validate='sync' names the row)")
    if PAGED:
        ends = lens.to(tl.int64) + n_new
        for start in range(0, max_pages, BLOCK):
            p = start + tl.arange(0, BLOCK)
            inside = p < max_pages
            page = tl.load(table_ptr + b * table_stride_b + p.to(tl.int64) * table_stride_p, mask=inside, other=0)
            tl.device_assert(kv_page_ok(page, p.to(tl.int64) * page_size, ends, num_pages) | ~inside,
                             "diyflash: a block_table entry in use is not a page of the cache "
                             "(validate='sync' names it)")


@triton.jit(debug=True)
def _kvcache_kernel(lens_ptr, pad_ptr, table_ptr, lens_stride, pad_stride, table_stride_b, table_stride_p,
                    n_new, capacity, page_size, max_pages, num_pages,
                    HAS_PAD: tl.constexpr, PAGED: tl.constexpr, BLOCK: tl.constexpr):
    kvcache_row_check(lens_ptr, pad_ptr, table_ptr, tl.program_id(0).to(tl.int64), lens_stride, pad_stride,
                      table_stride_b, table_stride_p, n_new, capacity, page_size, max_pages, num_pages,
                      HAS_PAD=HAS_PAD, PAGED=PAGED, BLOCK=BLOCK)


_SEQ_LENS = DirectLauncher(_seq_lens_kernel)
_CU_SEQLENS = DirectLauncher(_cu_seqlens_kernel)
_KVCACHE = DirectLauncher(_kvcache_kernel)


def check_seq_lens(seq_lens: torch.Tensor, n_k: int) -> None:
    """Queue the seq_lens check of a (B,) int32/int64 CUDA tensor, any stride."""
    if seq_lens.numel():
        _SEQ_LENS((1,), seq_lens, seq_lens.stride(0), seq_lens.shape[0], n_k, BLOCK=BLOCK, num_warps=4)


def check_cu_seqlens(cu: torch.Tensor, total: int, max_seqlen: int) -> None:
    """Queue the check of one (B + 1,) int32 cu_seqlens, any stride."""
    _CU_SEQLENS((1,), cu, cu.stride(0), cu.shape[0] - 1, total, max_seqlen, BLOCK=BLOCK, num_warps=4)


def check_kvcache(cache_seqlens: torch.Tensor, n_new: int, capacity: int, block_table: torch.Tensor | None,
                  num_pages: int, cache_leftpad: torch.Tensor | None) -> None:
    """Queue the check of a KV-cache call's positions and pages: one program per batch row."""
    launch = _kvcache_launch(cache_seqlens, n_new, capacity, block_table, num_pages, cache_leftpad)
    if launch is not None:
        grid, pointers, args, meta = launch
        _KVCACHE(grid, *pointers, *args, **meta)


def _kvcache_pointers(cache_seqlens, block_table, cache_leftpad, paged: bool) -> tuple:
    """The check kernel's pointers: the lengths, the left padding (the lengths stand in without it) and the
    page table (the lengths stand in for a contiguous cache)."""
    return (cache_seqlens, cache_leftpad if cache_leftpad is not None else cache_seqlens,
            block_table if paged else cache_seqlens)


def _kvcache_launch(cache_seqlens, n_new, capacity, block_table, num_pages, cache_leftpad):
    """(grid, pointers, args, meta) of the KV-cache check, None for an empty batch."""
    batch = cache_seqlens.shape[0]
    if batch == 0:
        return None
    paged = block_table is not None and block_table.numel() > 0
    max_pages = block_table.shape[1] if paged else 0
    pointers = _kvcache_pointers(cache_seqlens, block_table, cache_leftpad, paged)
    _, pad, table = pointers
    args = (cache_seqlens.stride(0), pad.stride(0), table.stride(0), table.stride(-1) if paged else 0, n_new, capacity,
            capacity // max_pages if paged else 0, max_pages, num_pages)
    meta = dict(HAS_PAD=cache_leftpad is not None, PAGED=paged, BLOCK=BLOCK, num_warps=1)
    return (batch,), pointers, args, meta
