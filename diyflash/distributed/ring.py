"""Ring attention: each rank keeps its shard of q, and the shards of k and v travel around the ring.

At step s rank r holds the k, v shard of rank r - s, sends it on to r + 1 while it attends to it
(point-to-point, asynchronous), and merges the partial result by its lse. Every (q chunk, kv chunk) pair
of the layout (layout.chunks_of) is one call of torch.ops.diyflash.attention_fwd (_pair): all keys
where every key of the pair is visible, nothing (skipped) where none is, and else the pair's band: the
call's causal flag and window with the diagonal offset between the two chunks' global positions
(diagonal_offset = (i - j) * chunk length), so a window is the same band of the whole sequence. A step
at which no rank has a visible pair is not run: the shards jump past it (_steps).
The backward circulates k and v the same way, with dk and dv accumulators that travel along with them
(each step's sends overlap the next step's gradients) and end at their owner; each pair's gradients
come from torch.ops.diyflash.attention_bwd with the merged out and lse, so they are the exact global
ones. Merges and sums run in a fixed order: the same inputs give bitwise the same results.
"""

from __future__ import annotations

import math

import torch

from ..api import attention_arguments
from .layout import check_layout, chunks_of, process_group, ring_shift, same_on_every_rank, wait, world

_ALL = (False, -1, -1, 0)  # every key of the pair is visible: the plain call, no mask


def _pair(i: int, j: int, c: int, causal: bool, window: tuple[int, int]) -> tuple[bool, int, int, int] | None:
    """How q chunk i sees kv chunk j (chunks of c rows; query position - key position = (i - j) * c + x - y
    over the pair's rows x and keys y): None where no key is visible, else the attention_fwd arguments
    (causal, window_left, window_right, diagonal_offset) that draw the whole sequence's mask on the pair;
    _ALL where every key is visible. Keys are visible where -right <= q - k <= left, right = 0 under
    causal, an unbounded side -1."""
    if c == 0:
        return _ALL
    left, right = window
    most = math.inf if left < 0 else left  # q - k <= most
    least = 0 if causal else -math.inf if right < 0 else -right  # q - k >= least
    d = (i - j) * c
    lo, hi = d - (c - 1), d + (c - 1)  # q - k over the pair
    if hi < least or lo > most:
        return None
    if least <= lo and hi <= most:
        return _ALL
    return causal, left, right, d


def _merge(acc, out, lse):
    """(out, lse) of two disjoint key sets merged: lse = log(e^lse1 + e^lse2), out their lse-weighted
    mean. Rows that saw no key in one part (lse -inf) take the other's values; acc None: the first part."""
    if acc is None:
        return out, lse
    out0, lse0 = acc
    new = torch.logaddexp(lse0, lse)
    safe = torch.where(new == float("-inf"), 0.0, new)
    w0 = torch.exp(lse0 - safe).unsqueeze(-1)
    w1 = torch.exp(lse - safe).unsqueeze(-1)
    return out0 * w0 + out * w1, new


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


def _steps(size: int, layout: str, c: int, causal: bool, window: tuple[int, int]) -> list[int]:
    """The ring steps that run, in order: those at which some rank has a pair with visible keys (the same
    list on every rank). Without a window, every step; with a window, a rank's shard of k and v jumps
    from one step's holder to the next one's (layout.ring_shift by their distance), past ranks that
    would only pass it on."""
    return [step for step in range(size)
            if any(any(True for _ in _pairs(r, (r - step) % size, size, layout, c, causal, window))
                   for r in range(size))]


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, causal, scale, softcap, window, group, layout):
        rank, size = world(group)
        per = len(chunks_of(rank, size, layout))
        c = q.shape[-2] // per
        steps = _steps(size, layout, c, causal, window)
        acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
        qs = q.chunk(per, dim=-2)
        acc = [None] * per
        kv = [k, v]
        for step, after in zip(steps, steps[1:] + [None]):
            if after is not None:
                nxt, reqs = ring_shift(kv, group, after - step)  # travels while this step computes
            src = (rank - step) % size
            ks, vs = kv[0].chunk(per, dim=-2), kv[1].chunk(per, dim=-2)
            for a, b, (pc, left, right, offset) in _pairs(rank, src, size, layout, c, causal, window):
                out, lse = torch.ops.diyflash.attention_fwd(qs[a], ks[b], vs[b], pc, scale, None, left, right,
                                                            softcap, None, None, offset)
                acc[a] = _merge(acc[a], out.to(acc_t), lse)
            if after is not None:
                wait(reqs)
                kv = nxt
        if sinks is not None:
            acc = [_with_sinks(o, l, sinks) for o, l in acc]
        out = torch.cat([o for o, _ in acc], dim=-2).to(q.dtype)
        lse = torch.cat([l for _, l in acc], dim=-1)
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
        dq = [torch.zeros(t.shape, dtype=acc_t, device=q.device) for t in qs]
        kv = [k, v]
        dkv = [torch.zeros(k.shape, dtype=acc_t, device=k.device), torch.zeros(v.shape, dtype=acc_t, device=v.device)]
        in_flight = None  # the accumulators of the kv shard this step holds, on their way from the previous rank
        want_dsinks = sinks is not None and ctx.needs_input_grad[3]
        dsinks_of = {}
        for step, after in zip(steps, steps[1:] + [None]):
            if after is not None:
                nxt, reqs = ring_shift(kv, group, after - step)
            src = (rank - step) % size
            ks, vs = kv[0].chunk(per, dim=-2), kv[1].chunk(per, dim=-2)
            kv_grads = []
            for a, b, (pc, left, right, offset) in _pairs(rank, src, size, layout, c, causal, window):
                # the sinks' gradient is the op's (a sum over chunk a's rows): asked for once per q chunk
                ask = sinks if want_dsinks and a not in dsinks_of else None
                g = torch.ops.diyflash.attention_bwd(dos[a], dlses[a], qs[a], ks[b], vs[b], outs[a], lses[a], pc,
                                                     scale, None, left, right, softcap, None, ask, offset)
                if ask is not None:
                    dsinks_of[a] = g[3]
                dq[a] += g[0]
                kv_grads.append((b, g[1], g[2]))
            if in_flight is not None:  # sent while this step computed
                wait(in_flight[1])
                dkv = in_flight[0]
            dks, dvs = dkv[0].chunk(per, dim=-2), dkv[1].chunk(per, dim=-2)
            for b, dk_b, dv_b in kv_grads:  # views of dkv: the accumulators travel with their k and v
                dks[b].add_(dk_b)
                dvs[b].add_(dv_b)
            # on with their k and v; after the last step, straight back to their owner (rank - step)
            in_flight = ring_shift(dkv, group, -step if after is None else after - step)
            if after is not None:
                wait(reqs)
                kv = nxt
        wait(in_flight[1])
        dkv = in_flight[0]
        dsinks = sum(dsinks_of[a] for a in sorted(dsinks_of)) if want_dsinks else None  # chunk order: deterministic
        return (torch.cat(dq, dim=-2).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), dsinks,
                None, None, None, None, None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None, *, group=None, layout: str = "zigzag",
                   window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, sinks: torch.Tensor | None = None,
                   return_lse: bool = False, validate: bool = True):
    """Context-parallel attention over the ranks of `group` (torch.distributed, a process group or a 1-D
    DeviceMesh; any backend: NCCL on GPUs, gloo on CPU). q (B, H, N/W, D), k and v (B, H_kv, N/W, D[_v])
    are this rank's shards of the sequence in `layout` (shard_sequence); the result is this rank's shard
    of the output (and with return_lse its lse (B, H, N/W) fp32), differentiable in q, k, v and sinks. GQA
    sends the H_kv heads only. causal, sm_scale, window_size, softcap and sinks ((H,) logits) as diyflash.flash_attention, over
    the whole sequence: a window is one band of global positions, each pair of chunks computes its part
    of it (or nothing), and the ring stops after the last step with work.
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
