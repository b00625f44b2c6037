"""How the launchers see a call's tensors: (Z, H, N, D) views of any input layout (3-D, packed sequences), their
strides as the kernels take them, the row statistics' shapes, and whether 32-bit row offsets or TMA can read
them in place (launch.attention_fwd, launch_bwd.attention_bwd)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._runtime import device_limits
from ..attention_configs import MAX_BLOCK_ROWS, head_dim_pad
from .launch_args import INTERPRETED
from .plans import packed_view


class Packed(NamedTuple):
    """Packed sequences (varlen): the tensors are token-major (total, H, D), seq_lens is cu_seqlens_q,
    cu_k is cu_seqlens_k (both int32 (B + 1,)), and max_q / max_k bound the sequences' lengths (the
    grid covers them; the unbounded side of a window is max_q + max_k)."""

    cu_k: torch.Tensor
    max_q: int
    max_k: int


def as_4d(t: torch.Tensor, packed: Packed | None = None) -> torch.Tensor:
    """(BH, N, D) -> (BH, 1, N, D) view; 4-D passes through; packed (T, H, D) -> (1, H, T, D). Never copies."""
    if packed is not None:
        return packed_view(t)
    return t.unsqueeze(1) if t.dim() == 3 else t


def stats_3d(t: torch.Tensor | None, q: torch.Tensor, packed: Packed | None) -> torch.Tensor | None:
    """A row statistic (lse, dlse, delta) as (Z, H, N) beside as_4d(q): packed (H, T) -> (1, H, T)."""
    if t is None:
        return None
    return t.unsqueeze(0) if packed is not None else t.unsqueeze(1) if q.dim() == 3 else t


def stats_shape(q: torch.Tensor, packed: Packed | None) -> tuple[int, ...]:
    # lse's shape: q.shape[:-1], or (H, T) for packed sequences (flash-attn's varlen layout)
    return (q.shape[1], q.shape[0]) if packed is not None else tuple(q.shape[:-1])


def heads_of(t: torch.Tensor) -> int:
    return t.shape[1] if t.dim() == 4 else 1


def call_dims(q: torch.Tensor, k: torch.Tensor, packed: Packed | None) -> tuple:
    """A dense call's (N_q, N_k, H_q, H_kv, cu_k, extra): the longest sequences' rows where packed, with cu_seqlens_k
    and (max_q, max_k) as the plan key's extra; else the tensors' rows, None and ()."""
    if packed is None:
        return q.shape[-2], k.shape[-2], heads_of(q), heads_of(k), None, ()
    return packed.max_q, packed.max_k, q.shape[1], k.shape[1], packed.cu_k, (packed.max_q, packed.max_k)


def kernel_strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The (Z, H, N, D) views' strides as the kernels take them, one view after the other; a single batch's z
    stride is 0 (never used by a dense call; packed sequences index rows, not batches, and reach z up to B)."""
    return tuple(s for t in tensors for s in (0 if t.shape[0] == 1 else t.stride(0), *t.stride()[1:]))


def rows_fit_int32(*tensors: torch.Tensor) -> bool:
    """Whether every offset inside one (batch, head) slice of these (Z, H, N, D) tensors that a tile can
    form fits in int32: row * row_stride + col * col_stride for rows up to N + MAX_BLOCK_ROWS (a last
    block's padding rows have addresses too, masked) and columns up to the padded head_dim. The kernels
    then compute row offsets in 32 bits (ROW32, _rows); the (batch, head) offsets are 64-bit either way."""
    return all((t.shape[2] + MAX_BLOCK_ROWS) * abs(t.stride(2)) + head_dim_pad(t.shape[3]) * abs(t.stride(3)) < 2**31
               for t in tensors)


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can read these (Z, H, N, D) tensors in place: fp16/bf16, head_dim
    contiguous, every other stride and the base address 16-byte aligned (strides of size-1 dims
    never move the address), on a GPU of compute capability 9.0 or newer. Under Triton's interpreter
    (CPU tensors) the descriptors are emulated, so tests run the TMA path there too."""
    for t in tensors:
        if t.dtype not in (torch.float16, torch.bfloat16) or t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any(size > 1 and stride * t.element_size() % 16 for size, stride in zip(t.shape[:-1], t.stride()[:-1])):
            return False
    device = tensors[0].device
    return device_limits(device).tma if device.type == "cuda" else INTERPRETED
