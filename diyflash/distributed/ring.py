"""Ring attention: each rank keeps its shard of q, and the shards of k and v travel around the ring.

At step s rank r holds the k, v shard of rank r - s, sends it on to r + 1 while it attends to it
(point-to-point, asynchronous), and merges the partial result by its lse. Every (q chunk, kv chunk) pair
of the layout (layout.chunks_of) is one call of torch.ops.diyflash.attention_fwd: all keys when the kv
chunk comes first in the sequence, the causal diagonal when it is the same chunk, nothing (skipped) when
it comes later under a causal mask. The backward circulates k and v the same way, with dk and dv
accumulators that travel along with them and end at their owner; each pair's gradients come from
torch.ops.diyflash.attention_bwd with the merged out and lse, so they are the exact global ones. Merges
and sums run in a fixed order: the same inputs give bitwise the same results.
"""

from __future__ import annotations

import math

import torch

from ..api import attention_arguments
from .layout import check_layout, chunks_of, process_group, ring_shift, same_on_every_rank, wait, world


def _pair(i: int, j: int, causal: bool) -> str | None:
    """How q chunk i sees kv chunk j: 'all' keys, the causal 'diagonal', or None (fully masked)."""
    if not causal or j < i:
        return "all"
    return "diagonal" if j == i else None


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


def _pairs(rank: int, src: int, size: int, layout: str, causal: bool):
    """(a, b, diagonal) for each pair of this rank's q chunk a and rank src's kv chunk b that has visible
    keys, in a fixed order."""
    for a, i in enumerate(chunks_of(rank, size, layout)):
        for b, j in enumerate(chunks_of(src, size, layout)):
            how = _pair(i, j, causal)
            if how is not None:
                yield a, b, how == "diagonal"


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, causal, scale, softcap, group, layout):
        rank, size = world(group)
        per = len(chunks_of(rank, size, layout))
        acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
        qs = q.chunk(per, dim=-2)
        acc = [None] * per
        kv = [k, v]
        for step in range(size):
            if step + 1 < size:
                nxt, reqs = ring_shift(kv, group)  # travels while this step computes
            src = (rank - step) % size
            ks, vs = kv[0].chunk(per, dim=-2), kv[1].chunk(per, dim=-2)
            for a, b, diagonal in _pairs(rank, src, size, layout, causal):
                out, lse = torch.ops.diyflash.attention_fwd(qs[a], ks[b], vs[b], diagonal, scale, None, -1, -1,
                                                            softcap, None, None)
                acc[a] = _merge(acc[a], out.to(acc_t), lse)
            if step + 1 < size:
                wait(reqs)
                kv = nxt
        if sinks is not None:
            acc = [_with_sinks(o, l, sinks) for o, l in acc]
        out = torch.cat([o for o, _ in acc], dim=-2).to(q.dtype)
        lse = torch.cat([l for _, l in acc], dim=-1)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.args = (causal, scale, softcap, group, layout)
        ctx.set_materialize_grads(False)  # an unused lse gets no gradient: no dlse term in the backward
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        causal, scale, softcap, group, layout = ctx.args
        rank, size = world(group)
        per = len(chunks_of(rank, size, layout))
        acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        qs, dos, outs, lses = (t.chunk(per, dim=-2 if t.dim() == q.dim() else -1) for t in (q, dout, out, lse))
        dlses = dlse.chunk(per, dim=-1) if dlse is not None else [None] * per
        dq = [torch.zeros(c.shape, dtype=acc_t, device=q.device) for c in qs]
        kv = [k, v]
        dkv = [torch.zeros(k.shape, dtype=acc_t, device=k.device), torch.zeros(v.shape, dtype=acc_t, device=v.device)]
        want_dsinks = sinks is not None and ctx.needs_input_grad[3]
        dsinks_of = {}
        for step in range(size):
            if step + 1 < size:
                nxt, reqs = ring_shift(kv, group)
            src = (rank - step) % size
            ks, vs = kv[0].chunk(per, dim=-2), kv[1].chunk(per, dim=-2)
            dks, dvs = dkv[0].chunk(per, dim=-2), dkv[1].chunk(per, dim=-2)
            for a, b, diagonal in _pairs(rank, src, size, layout, causal):
                # the sinks' gradient is the op's (a sum over chunk a's rows): asked for once per q chunk
                ask = sinks if want_dsinks and a not in dsinks_of else None
                g = torch.ops.diyflash.attention_bwd(dos[a], dlses[a], qs[a], ks[b], vs[b], outs[a], lses[a], diagonal,
                                                     scale, None, -1, -1, softcap, None, ask)
                if ask is not None:
                    dsinks_of[a] = g[3]
                dq[a] += g[0]
                dks[b].add_(g[1])  # views of dkv: the accumulators travel with their k and v
                dvs[b].add_(g[2])
            if size > 1:  # the accumulators follow their k and v; after the last step they reach the owner
                dkv_next, dkv_reqs = ring_shift(dkv, group)
                if step + 1 < size:
                    wait(reqs)
                    kv = nxt
                wait(dkv_reqs)
                dkv = dkv_next
        dsinks = sum(dsinks_of[a] for a in sorted(dsinks_of)) if want_dsinks else None  # chunk order: deterministic
        return (torch.cat(dq, dim=-2).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), dsinks,
                None, None, None, None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None, *, group=None, layout: str = "zigzag",
                   window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, sinks: torch.Tensor | None = None,
                   return_lse: bool = False, validate: bool = True):
    """Context-parallel attention over the ranks of `group` (torch.distributed, a process group or a 1-D
    DeviceMesh; any backend: NCCL on GPUs, gloo on CPU). q (B, H, N/W, D), k and v (B, H_kv, N/W, D[_v])
    are this rank's shards of the sequence in `layout` (shard_sequence); the result is this rank's shard
    of the output (and with return_lse its lse (B, H, N/W) fp32), differentiable in q, k, v and sinks. GQA sends the H_kv heads
    only. causal, sm_scale, softcap and sinks ((H,) logits) as diyflash.flash_attention. Windows are
    not supported here (a window moves by a different offset for each pair of chunks, which the
    kernels' bottom-right windows do not express): use ulysses_attention, which runs windows.
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
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"ring_attention does not take windows (got window_size={tuple(window_size)}): a "
                                  "window shifts differently for each pair of sequence chunks; ulysses_attention runs "
                                  "them")
    causal, sm_scale, _, _, softcap = attention_arguments(q, k, v, causal, sm_scale, window_size, softcap, None, sinks,
                                                          any_device=True)
    group = process_group(group)
    per = len(chunks_of(0, world(group)[1], layout))
    if q.shape[-2] % per:
        raise ValueError(f"a zigzag shard holds two equal chunks: its length ({q.shape[-2]}) must be even")
    if bool_flag("validate", validate):
        same_on_every_rank("ring_attention", group, dict(q=q, k=k, v=v, sinks=sinks),
                           dict(causal=causal, sm_scale=sm_scale, softcap=softcap, layout=layout, lse=return_lse))
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    out, lse = _Ring.apply(q, k, v, sinks, causal, scale, softcap, group, layout)
    return (out, lse) if bool_flag("return_lse", return_lse) else out


def bool_flag(name: str, value) -> bool:
    if not isinstance(value, bool):  # bool("no") is True: refused, as flash_attention refuses it
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value
