"""Ring attention: each rank keeps its shard of q, and the shards of k and v travel around the ring.

At step s rank r holds the k, v shard of rank r - s, sends it on to r + 1 while it attends to it
(point-to-point, asynchronous), and merges the partial result by its lse. Every (q chunk, kv chunk) pair
of the layout (layout.chunks_of) is one call of torch.ops.diyflash.attention_fwd (_pair): all keys
where every key of the pair is visible, nothing (skipped) where none is, and else the pair's band: the
call's causal flag and window with the diagonal offset between the two chunks' global positions
(diagonal_offset), on the box of rows and keys that holds the pair's visible keys, so a window is the
same band of the whole sequence and a pair's thin corner of it costs that corner. A step
at which no rank has a visible pair is not run: the shards jump past it (_steps).
The backward circulates k and v the same way. A rank keeps the gradients of its own shard (step 0) at
home; the other ranks' gradients to a shard travel with it as fp32 accumulators of only the rows they
touched (_travelled: the whole chunk without a window, a window's corner with one), each send overlapping
the next step's gradients, and come home after the last step. Each pair's gradients come from
torch.ops.diyflash.attention_bwd with the merged out and lse, so they are the exact global ones. Outputs
and dq are summed by sums.ChunkSum. Merges and sums run in a fixed order: the same inputs give bitwise the
same results.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ..api import attention_arguments
from .layout import check_layout, chunks_of, exchange, process_group, ring_shift, same_on_every_rank, wait, world
from .sums import ChunkSum, part


class Call(NamedTuple):
    """One pair's attention call: the rows [x0, x1) of the q chunk and the keys [y0, y1) of the kv chunk that
    hold every visible (row, key), and the attention_fwd arguments that draw the sequence's mask there."""

    causal: bool
    left: int
    right: int
    offset: int
    rows: tuple[int, int]
    keys: tuple[int, int]


def _pair(i: int, j: int, c: int, causal: bool, window: tuple[int, int]) -> Call | None:
    """How q chunk i sees kv chunk j (chunks of c rows; query position - key position = (i - j) * c + x - y
    over the pair's rows x and keys y): None where no key is visible; a plain call (no mask) on the whole
    pair where every key is; else the smallest box of rows and keys with every visible one, and causal,
    the window and the diagonal offset that draw the whole sequence's band on it. Keys are visible where
    -right <= q - k <= left, right = 0 under causal, an unbounded side -1."""
    if c == 0:
        return Call(False, -1, -1, 0, (0, 0), (0, 0))
    left, right = window
    most = math.inf if left < 0 else left  # q - k <= most
    least = 0 if causal else -math.inf if right < 0 else -right  # q - k >= least
    d = (i - j) * c
    if d + c - 1 < least or d - (c - 1) > most:  # q - k spans d - (c - 1) .. d + c - 1 over the pair
        return None
    if least <= d - (c - 1) and d + c - 1 <= most:
        return Call(False, -1, -1, 0, (0, c), (0, c))
    x0, x1 = max(0, least - d), min(c, most - d + c)  # rows with a visible key
    y0, y1 = max(0, d - most), min(c, c + d - least)  # keys seen by some row
    # the call's row x' is row x0 + x'; its key positions sit at x' + (y1 - y0) - (x1 - x0) + offset
    offset = x0 - y0 + d - ((y1 - y0) - (x1 - x0))
    return Call(causal, left, right, offset, (x0, x1), (y0, y1))


def _with_sinks(out, lse, sinks):
    """One more logit per row (the head's sink) in the denominator, carrying no value."""
    sink = sinks.to(lse.dtype).view(1, -1, 1).expand_as(lse)
    new = torch.logaddexp(lse, sink)
    return out * torch.exp(lse - new).unsqueeze(-1), new


def _pairs(rank: int, src: int, size: int, layout: str, c: int, causal: bool, window: tuple[int, int]):
    """(a, b, call) for each pair of this rank's q chunk a and rank src's kv chunk b that has visible
    keys, in a fixed order; call: _pair's arguments."""
    for a, i in enumerate(chunks_of(rank, size, layout)):
        for b, j in enumerate(chunks_of(src, size, layout)):
            call = _pair(i, j, c, causal, window)
            if call is not None:
                yield a, b, call


@functools.lru_cache(maxsize=256)  # W^2 pairs of Python: once per ring geometry, not per call
def _steps(size: int, layout: str, c: int, causal: bool, window: tuple[int, int]) -> tuple[int, ...]:
    """The ring steps that run, in order: those at which some rank has a pair with visible keys (the same
    list on every rank). Without a window, every step; with a window, a rank's shard of k and v jumps
    from one step's holder to the next one's (layout.ring_shift by their distance), past ranks that
    would only pass it on."""
    return tuple(step for step in range(size)
                 if any(any(True for _ in _pairs(r, (r - step) % size, size, layout, c, causal, window))
                        for r in range(size)))


def _hull(boxes: list[tuple[int, int]]) -> tuple[int, int]:
    """The smallest row range holding these boxes; (0, 0) for none."""
    boxes = [box for box in boxes if box[1] > box[0]]
    return (min(lo for lo, _ in boxes), max(hi for _, hi in boxes)) if boxes else (0, 0)


@functools.lru_cache(maxsize=4096)
def _travelled(owner: int, upto: int, size: int, layout: str, c: int, causal: bool,
               window: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """Per kv chunk of rank owner's shard: the rows that the ranks after it gave gradients to in the ring's
    steps[1] .. steps[upto] (their hull), which is all the travelling dk/dv accumulators of that shard carry.
    Every rank computes it alike, so each knows the shapes it receives."""
    per = len(chunks_of(owner, size, layout))
    boxes = [[] for _ in range(per)]
    for step in _steps(size, layout, c, causal, window)[1:upto + 1]:
        for _, b, call in _pairs((owner + step) % size, owner, size, layout, c, causal, window):
            boxes[b].append(call.keys)
    return tuple(_hull(bx) for bx in boxes)


def _rows_shape(t: torch.Tensor, rows: tuple[int, int]) -> tuple[int, ...]:
    return (*t.shape[:-2], rows[1] - rows[0], t.shape[-1])


def _carried(got: list | None, before: list, rows: list, ks, vs, acc_t) -> list[torch.Tensor]:
    """The travelling accumulators of a shard, [dk, dv] per chunk b over its rows[b], in acc_t: what arrived
    (`got`, over before[b]; None at the shard's first foreign step) in its place, zeros elsewhere."""
    travel = []
    for b in range(len(rows)):
        for i, t in enumerate((ks[b], vs[b])):
            mine = None if got is None else got[2 * b + i]
            if mine is None or before[b] != rows[b]:
                grown = t.new_zeros(_rows_shape(t, rows[b]), dtype=acc_t)
                if mine is not None and mine.numel():
                    part(grown, (before[b][0] - rows[b][0], before[b][1] - rows[b][0])).copy_(mine)
                mine = grown
            travel.append(mine)
    return travel


def _add_grads(dst: tuple, origin: list[int], kv_grads: list) -> None:
    """Add each pair's (kv chunk b, keys, dk, dv) into dst = (dk chunks, dv chunks) whose row 0 is row
    origin[b] of chunk b."""
    for b, (y0, y1), dk_b, dv_b in kv_grads:
        part(dst[0][b], (y0 - origin[b], y1 - origin[b])).add_(dk_b)
        part(dst[1][b], (y0 - origin[b], y1 - origin[b])).add_(dv_b)


def _joined(parts: list[torch.Tensor], dim: int, dtype) -> torch.Tensor:
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim)).to(dtype)


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, causal, scale, softcap, window, group, layout):
        rank, size = world(group)
        per = len(chunks_of(rank, size, layout))
        c = q.shape[-2] // per
        steps = _steps(size, layout, c, causal, window)
        acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
        qs = q.chunk(per, dim=-2)
        acc = [ChunkSum(c, acc_t) for _ in range(per)]
        kv = [k, v]
        for step, after in zip(steps, (*steps[1:], None)):
            if after is not None:
                nxt, reqs = ring_shift(kv, group, after - step)  # travels while this step computes
            src = (rank - step) % size
            ks, vs = kv[0].chunk(per, dim=-2), kv[1].chunk(per, dim=-2)
            for a, b, call in _pairs(rank, src, size, layout, c, causal, window):
                out, lse = torch.ops.diyflash.attention_fwd(
                    part(qs[a], call.rows), part(ks[b], call.keys), part(vs[b], call.keys), call.causal, scale,
                    None, call.left, call.right, softcap, None, None, call.offset)
                acc[a].merge(out, lse, call.rows)
            if after is not None:
                wait(reqs)
                kv = nxt
        if sinks is not None:
            outs = [_with_sinks(s.exact(), s.lse, sinks) for s in acc]
        else:
            outs = [(s.result(q.dtype), s.lse) for s in acc]
        out = _joined([o for o, _ in outs], -2, q.dtype)
        lse = _joined([l for _, l in outs], -1, acc_t)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.args = (causal, scale, softcap, window, group, layout)
        ctx.set_materialize_grads(False)  # an unused lse gets no gradient: no dlse term in the backward
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        causal, scale, softcap, window, group, layout = ctx.args
        rank, size = world(group)
        per = len(chunks_of(rank, size, layout))
        c = q.shape[-2] // per
        steps = _steps(size, layout, c, causal, window)
        acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        qs, dos, outs, lses = (t.chunk(per, dim=-2 if t.dim() == q.dim() else -1) for t in (q, dout, out, lse))
        dlses = dlse.chunk(per, dim=-1) if dlse is not None else [None] * per
        dq = [ChunkSum(c, acc_t) for _ in range(per)]
        kv = [k, v]
        # this rank's own dk/dv (its step-0 pairs, then what the others send back); the others' gradients to
        # the shard in hand travel with it as (rows, dk part, dv part) per chunk, only the rows they touched
        home = [torch.zeros(k.shape, dtype=acc_t, device=k.device), torch.zeros(v.shape, dtype=acc_t, device=v.device)]
        home_chunks = [t.chunk(per, dim=-2) for t in home]
        arriving = None  # (parts, requests) of the accumulators of the shard in hand, from its previous holder
        want_dsinks = sinks is not None and ctx.needs_input_grad[3]
        dsinks_of = {}
        for n, (step, after) in enumerate(zip(steps, (*steps[1:], None))):
            if after is not None:
                nxt, reqs = ring_shift(kv, group, after - step)
            src = (rank - step) % size
            ks, vs = kv[0].chunk(per, dim=-2), kv[1].chunk(per, dim=-2)
            kv_grads = []
            for a, b, call in _pairs(rank, src, size, layout, c, causal, window):
                # the sinks' gradient is the op's (a sum over chunk a's rows): asked for once per q chunk, of
                # a pair with all its rows (the chunk's own diagonal pair has them)
                ask = sinks if want_dsinks and a not in dsinks_of and call.rows == (0, c) else None
                rows = call.rows
                g = torch.ops.diyflash.attention_bwd(
                    part(dos[a], rows), None if dlses[a] is None else part(dlses[a], rows, -1),
                    part(qs[a], rows), part(ks[b], call.keys), part(vs[b], call.keys), part(outs[a], rows),
                    part(lses[a], rows, -1), call.causal, scale, None, call.left, call.right, softcap, None, ask,
                    call.offset)
                if ask is not None:
                    dsinks_of[a] = g[3]
                dq[a].add(g[0], rows)
                kv_grads.append((b, call.keys, g[1], g[2]))
            if n == 0:  # the own shard: its gradients stay here
                _add_grads(home_chunks, [0] * per, kv_grads)
            else:  # the shard's travelling accumulators: what arrived, plus this step's, on to the next holder
                carried = _travelled(src, n, size, layout, c, causal, window)
                before = _travelled(src, n - 1, size, layout, c, causal, window)
                got = None
                if arriving is not None:  # sent by the previous holder while this step computed
                    wait(arriving[1])
                    got = arriving[0]
                travel = _carried(got, before, carried, ks, vs, acc_t)
                _add_grads((travel[0::2], travel[1::2]), [lo for lo, _ in carried], kv_grads)
                # to the shard's next holder, or after the last step back to its owner; what comes in is the
                # accumulators of the shard this rank holds next (at the end, of its own)
                owner = (rank - after) % size if after is not None else rank
                incoming = _travelled(owner, n, size, layout, c, causal, window)
                bufs = [torch.empty(_rows_shape(t, incoming[b]), dtype=acc_t, device=t.device)
                        for b in range(per) for t in (ks[b], vs[b])]
                arriving = (bufs, exchange(travel, bufs, group, after - step if after is not None else -step))
            if after is not None:
                wait(reqs)
                kv = nxt
        if arriving is not None:  # the others' gradients to this rank's shard, back home
            wait(arriving[1])
            back = _travelled(rank, len(steps) - 1, size, layout, c, causal, window)
            got = arriving[0]
            _add_grads(home_chunks, [0] * per, [(b, back[b], got[2 * b], got[2 * b + 1]) for b in range(per)])
        dsinks = sum(dsinks_of[a] for a in sorted(dsinks_of)) if want_dsinks else None  # chunk order: deterministic
        return (_joined([s.result(q.dtype) for s in dq], -2, q.dtype), home[0].to(k.dtype), home[1].to(v.dtype),
                dsinks, None, None, None, None, None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None, *, group=None, layout: str = "zigzag",
                   window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, sinks: torch.Tensor | None = None,
                   return_lse: bool = False, validate: bool = True):
    """Context-parallel attention over the ranks of `group` (torch.distributed, a process group or a 1-D
    DeviceMesh; any backend: NCCL on GPUs, gloo on CPU). q (B, H, N/W, D), k and v (B, H_kv, N/W, D[_v])
    are this rank's shards of the sequence in `layout` (shard_sequence); the result is this rank's shard
    of the output (and with return_lse its lse (B, H, N/W) fp32), differentiable in q, k, v and sinks. GQA
    sends the H_kv heads only. causal, sm_scale, window_size, softcap and sinks ((H,) logits) as
    diyflash.flash_attention, over the whole sequence: a window is one band of global positions, each pair
    of chunks computes its part of it (or nothing), and steps with no work for any rank do not run.
    Every rank's arguments follow flash_attention's rules; validate (default) also compares the shards'
    shapes and dtypes and the arguments across ranks, once per call (layout.same_on_every_rank: one small
    all_gather, which waits for the group's queued work)."""
    check_layout(layout)
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        raise TypeError("q, k and v must be tensors")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"ring_attention takes (B, H, N/W, D) shards, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if k.shape[-2] != q.shape[-2] or v.shape[-2] != q.shape[-2]:
        raise ValueError(f"q, k and v shards must have one length (self-attention over one sequence), got "
                         f"{q.shape[-2]}, {k.shape[-2]}, {v.shape[-2]}")
    causal, sm_scale, left, right, softcap = attention_arguments(q, k, v, causal, sm_scale, window_size, softcap,
                                                                 None, sinks, any_device=True)
    group = process_group(group)
    per = len(chunks_of(0, world(group)[1], layout))
    if q.shape[-2] % per:
        raise ValueError(f"a zigzag shard holds two equal chunks: its length ({q.shape[-2]}) must be even")
    if bool_flag("validate", validate):
        same_on_every_rank("ring_attention", group, dict(q=q, k=k, v=v, sinks=sinks),
                           dict(causal=causal, sm_scale=sm_scale, left=left, right=right, softcap=softcap,
                                layout=layout, lse=return_lse))
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    out, lse = _Ring.apply(q, k, v, sinks, causal, scale, softcap, (left, right), group, layout)
    return (out, lse) if bool_flag("return_lse", return_lse) else out


def bool_flag(name: str, value) -> bool:
    if not isinstance(value, bool):  # bool("no") is True: refused, as flash_attention refuses it
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value
