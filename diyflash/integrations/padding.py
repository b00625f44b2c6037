"""Padded batches and packed rows as packed sequences for diyflash.flash_attention_varlen: the tokens a
(B, S) key-padding mask keeps, or the sequences position_ids restart. Used by the SDPA drop-in and the
transformers backend. Unpadding gathers the kept tokens (one copy of each of q, k, v, as flash-attn's and
transformers' unpad_input do); the padded output has zeros where a query row sees no key."""

from __future__ import annotations

from typing import NamedTuple

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


def pad(parts, batch: int, length: int) -> torch.Tensor:
    """[(index, rows (T, H, D)), ...] -> (B, N, H, D): rows at flat positions `index` of (B * N), zeros
    elsewhere; an index equal to B * N is a discarded row (a slot that holds no query)."""
    rows = parts[0][1]
    out = rows.new_zeros(batch * length + 1, *rows.shape[1:])
    for index, rows in parts:
        out.index_copy_(0, index, rows)
    return out[:-1].view(batch, length, *rows.shape[1:])


class Unpadded(NamedTuple):
    """How an attention under a (B, S) padding mask runs as packed sequences (see `unpad_attention`)."""
    keep_k: torch.Tensor  # flat indices (of B * len_k) of the keys attended, in order
    cu_k: torch.Tensor
    keep_q: torch.Tensor | None  # flat indices (of B * len_q) of the query rows run; None: every row
    cu_q: torch.Tensor
    left: int  # the window's left side for that call (-1: none)
    tail: tuple | None  # trailing pad rows: (rows, destination, cu_seqlens, slots, left) or None
    gaps: tuple | None = None  # pad rows inside a gap (_gap_rows) or None


def unpad_attention(mask: torch.Tensor, len_q: int, len_k: int, causal: bool, left: int) -> Unpadded:
    """Attention of the last len_q of len_k positions under a (B, len_k) bool key-padding mask and a window
    of `left` keys before the diagonal (-1: none), in the positions of the padded batch, as packed sequences
    of the kept keys, exactly as a dense masked attention (sdpa) computes every query row:
    - not causal: every row sees every kept key (a window with padding: NotImplementedError);
    - one query (a decode step): the keys kept by the mask *and* the window, each seen by the query: exact
      for any mask, gaps (a right-padded prompt followed by generated tokens) included;
    - several: the kept query rows against the kept keys (causal order survives the gather; the window does
      when a row's kept keys are contiguous); pad rows before a row's first kept key see nothing (0); pad rows
      after its last kept key (right padding) see the last kept keys in their window: `tail`, a second call
      with `slots` query rows per batch row (positions last + 1, ...), aligned so that window (left - slots,
      -1), non-causal, is each one's window; pad rows inside a gap (a pad token within a prompt) see the kept
      keys before them: `gaps`, a third call (_gap_rows). A window over a mask with gaps would need per-row
      key ranges: NotImplementedError.
    Two device syncs (the counts, then the indices; two more with gap rows): compute once per forward."""
    batch = mask.shape[0]
    pos = torch.arange(len_k, device=mask.device)
    if not causal:
        if left >= 0:
            raise NotImplementedError(
                f"a sliding window ({left + 1} positions) without causal masking over a padded batch: the pad "
                "rows' windows would need per-row key ranges")
        keep_k, cu_k = kept(mask)
        return Unpadded(keep_k, cu_k, None, uniform(batch, len_q, mask.device), -1, None)
    if len_q == 1:
        if left >= 0:
            mask = mask & (pos >= len_k - 1 - left)
        keep_k, cu_k = kept(mask)
        return Unpadded(keep_k, cu_k, None, uniform(batch, 1, mask.device), -1, None)
    q0 = len_k - len_q  # position of the first query row
    count = mask.sum(1)
    first = torch.where(mask, pos, len_k).amin(1, keepdim=True)
    last = torch.where(mask, pos, -1).amax(1, keepdim=True)
    gaps = (count > 0) & (last.squeeze(1) - first.squeeze(1) + 1 != count)
    inner = ~mask[:, q0:] & (pos[q0:] > first) & (pos[q0:] < last)  # pad query rows inside a gap
    trailing = torch.where(count > 0, len_k - 1 - last.squeeze(1), 0)
    has_gaps, has_inner, most = torch.stack([gaps.any(), inner.any(), trailing.amax()]).tolist()
    if has_gaps and left >= 0:
        raise NotImplementedError(
            f"a sliding window ({left + 1} positions) over a padding mask with a gap (kept tokens, padding, kept "
            "tokens) for several query rows at once: the window counts the padding's positions, which packed "
            "sequences cannot express (one query row at a time can)")
    keep_k, cu_k = kept(mask)
    gap_rows = _gap_rows(mask, inner, keep_k, cu_k, q0, len_q) if has_inner else None
    keep_q, cu_q = (keep_k, cu_k) if len_q == len_k else kept(mask[:, q0:])
    slots = most if left < 0 else min(most, left)  # rows past last + left see no key: they stay 0
    tail = None
    if slots > 0:
        at = last + 1 + torch.arange(slots, device=mask.device)  # (B, slots) positions after the last kept key
        real = (count > 0).unsqueeze(1) & (at >= q0) & (at < len_k)
        flat = torch.arange(batch, device=mask.device).unsqueeze(1) * len_q + at - q0
        rows = torch.where(real, flat, 0).reshape(-1)
        dest = torch.where(real, flat, batch * len_q).reshape(-1)
        tail = (rows, dest, uniform(batch, slots, mask.device), slots, -1 if left < 0 else left - slots)
    return Unpadded(keep_k, cu_k, keep_q, cu_q, left, tail, gap_rows)


GAP_KEYS_PER_KEPT = 4  # the gap rows' key copies, at most this many per kept key (else NotImplementedError)


def _gap_rows(mask, inner, keep_k, cu_k, q0: int, len_q: int):
    """Pad query rows inside a gap, without a window: the row at position p sees the c(p) kept keys before
    it, a prefix of its batch row's kept keys, the same for a run of such rows. Each run becomes one packed
    sequence against its own copy of that prefix: (rows, key indices, cu_seqlens_q, cu_seqlens_k, max_q,
    max_k). Two syncs. A mask of many gaps, whose copies would pass GAP_KEYS_PER_KEPT per kept key, raises."""
    b, col = inner.nonzero(as_tuple=True)  # in (batch row, position) order: a run's rows are consecutive
    before = (torch.cumsum(mask, 1) - mask.long())[b, q0 + col]  # c(p) >= 1 inside a gap
    _, run_rows = torch.unique_consecutive(b * (mask.shape[1] + 1) + before, return_counts=True)
    starts = torch.cumsum(run_rows, 0) - run_rows
    run_keys = before[starts]
    total, most_rows, most_keys = torch.stack([run_keys.sum(), run_rows.max(), run_keys.max()]).tolist()
    if total > GAP_KEYS_PER_KEPT * max(keep_k.numel(), 1024):
        raise NotImplementedError(
            f"a padding mask with many gaps among the query rows: their rows would need {total} key copies "
            f"(more than {GAP_KEYS_PER_KEPT} per kept key)")
    cu_keys = cu_seqlens(run_keys.to(torch.int32))
    run_of_key = torch.repeat_interleave(torch.arange(run_keys.shape[0], device=mask.device), run_keys,
                                         output_size=total)
    within = torch.arange(total, device=mask.device) - cu_keys[:-1].long()[run_of_key]
    keys = keep_k[cu_k[:-1].long()[b[starts]][run_of_key] + within]
    return (b * len_q + col, keys, cu_seqlens(run_rows.to(torch.int32)), cu_keys, most_rows, most_keys)


def sequence_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """(T,) bool: where one row of position_ids (1, T) starts a sequence: its first token, and every token
    whose position is not the previous one's plus 1 (transformers' find_packed_sequence_indices: rows
    packed in any order, [5..10, 0..5], or a position that repeats or falls, start sequences of their own)."""
    pos = position_ids.reshape(-1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[1:] = pos[1:] != pos[:-1] + 1
    return starts


def sequences_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """cu_seqlens of the sequences packed in one row of position_ids (1, T) (sequence_starts). Eagerly the
    starts are found with nonzero (one device sync); while compiling, a fixed-size (T + 1,) cu_seqlens
    (sequences past the last are empty) keeps shapes static and the graph whole, at the cost of T grid
    slices."""
    starts = sequence_starts(position_ids)
    total = starts.shape[0]
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()):
        first = starts.nonzero().squeeze(1).to(torch.int32)
        return torch.cat([first, first.new_full((1,), total)])
    seq = torch.cumsum(starts.to(torch.int32), 0) - 1  # sequence of each token (the first token starts one)
    lengths = torch.zeros(total, dtype=torch.int32, device=starts.device).scatter_add(0, seq.long(), torch.ones_like(seq))
    return cu_seqlens(lengths)
