"""Padded batches and packed rows as packed sequences for diyflash.flash_attention_varlen: the tokens a
(B, S) key-padding mask keeps, or the sequences position_ids restart. Used by the SDPA drop-in and the
transformers backend. Unpadding gathers the kept tokens (one copy of each of q, k, v, as flash-attn's and
transformers' unpad_input do); the padded output has zeros where a query row was dropped."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_major(t: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D) -> (B * N, H, D): a view when t is a (B, N, H, D) buffer seen through transpose(1, 2)
    (how attention layers make q, k, v), else a copy."""
    return t.transpose(1, 2).reshape(t.shape[0] * t.shape[2], t.shape[1], t.shape[3])


def cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """(B,) lengths -> int32 (B + 1,) offsets starting at 0."""
    return F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def uniform(batch: int, length: int, device) -> torch.Tensor:
    """cu_seqlens of `batch` sequences of `length` tokens each."""
    return torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)


def kept(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of the True entries of a (B, N) bool mask, and their cu_seqlens."""
    return mask.reshape(-1).nonzero().squeeze(1), cu_seqlens(mask.sum(1, dtype=torch.int32))


def pad(packed: torch.Tensor, index: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """(T, H, D) rows at flat positions `index` of (B * N) -> (B, N, H, D), zeros elsewhere."""
    out = packed.new_zeros(batch * length, *packed.shape[1:])
    out = out.index_copy(0, index, packed)
    return out.view(batch, length, *packed.shape[1:])


def sequences_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """cu_seqlens of the sequences packed in one row of position_ids (1, T) (a sequence starts wherever the
    position is the row's smallest, as in transformers). Eagerly the starts are
    found with nonzero (one device sync); while compiling, a fixed-size (T + 1,) cu_seqlens (sequences past
    the last are empty) keeps shapes static and the graph whole, at the cost of T grid slices."""
    pos = position_ids.reshape(-1)
    total = pos.shape[0]
    starts = pos == pos.min()
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()):
        first = starts.nonzero().squeeze(1).to(torch.int32)
        return torch.cat([first, first.new_full((1,), total)])
    seq = torch.cumsum(starts.to(torch.int32), 0) - 1  # sequence of each token (0 when the row starts mid-way)
    lengths = torch.zeros(total, dtype=torch.int32, device=pos.device).scatter_add(
        0, seq.clamp(min=0).long(), torch.ones_like(seq))
    return cu_seqlens(lengths)
