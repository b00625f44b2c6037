"""Ulysses attention (DeepSpeed-Ulysses): an all-to-all turns the sequence-sharded (B, H, N/W, D) into
head-sharded (B, H/W, N, D), each rank runs torch.ops.diyflash.attention_fwd (flash_attention's op, with
the lse) on the whole sequence for its heads (so every variant works: causal, windows, softcap, sinks,
GQA), and a second all-to-all turns the output back. The two exchanges are each other's backward."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..api import attention_arguments
from .layout import check_layout, process_group, same_on_every_rank, shard_of, unshard, world
from .ring import bool_flag


def _to_heads(x, group, layout):
    """(B, H, N/W, D) sequence shard -> (B, H/W, N, D): the whole sequence of this rank's heads."""
    rank, size = world(group)
    sends = [part.contiguous() for part in x.chunk(size, dim=1)]  # head group g goes to rank g
    recvs = [torch.empty_like(sends[rank]) for _ in range(size)]  # rank s's shard of my heads
    dist.all_to_all(recvs, sends, group=group)
    return unshard(recvs, 2, layout)


def _to_sequence(x, group, layout):
    """(B, H/W, N, D) -> (B, H, N/W, D): the inverse of _to_heads."""
    _, size = world(group)
    sends = [shard_of(x, r, size, 2, layout).contiguous() for r in range(size)]  # rank r's part of the sequence
    recvs = [torch.empty_like(sends[0]) for _ in range(size)]  # head group s, my part of the sequence
    dist.all_to_all(recvs, sends, group=group)
    return torch.cat(recvs, dim=1)


class Exchange(torch.autograd.Function):
    """_to_heads (to_heads) or _to_sequence; each is the other's backward."""

    @staticmethod
    def forward(ctx, x, group, layout, to_heads):
        ctx.args = (group, layout, to_heads)
        return (_to_heads if to_heads else _to_sequence)(x, group, layout)

    @staticmethod
    def backward(ctx, grad):
        group, layout, to_heads = ctx.args
        return (_to_sequence if to_heads else _to_heads)(grad, group, layout), None, None, None


def to_heads(q, k, v, sinks, group, layout):
    """Sequence shards of q, k, v (and the (H,) sinks) -> this rank's heads of the whole sequence (of the
    group's shards in `layout`): kv heads repeated to H first where the group size does not divide H_kv."""
    rank, size = world(group)
    h, h_kv = q.shape[1], k.shape[1]
    if h_kv % size:
        k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
    q, k, v = (Exchange.apply(t, group, layout, True) for t in (q, k, v))
    return q, k, v, None if sinks is None else sinks.chunk(size)[rank]


def to_sequence(out, lse, group, layout, return_lse: bool):
    """to_heads' inverse for an attention's out (and lse where return_lse): out, or (out, lse)."""
    out = Exchange.apply(out, group, layout, False)
    if not return_lse:
        return out
    return out, Exchange.apply(lse.unsqueeze(-1), group, layout, False).squeeze(-1)


def check_head_split(fn: str, q, k, v, size: int) -> None:
    """(B, H, N/W, D) shards whose H query heads split over `size` ranks and group over the kv heads."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        raise TypeError("q, k and v must be tensors")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{fn} takes (B, H, N/W, D) shards, got q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                         f"{tuple(v.shape)}")
    h, h_kv = q.shape[1], k.shape[1]
    if h % size:
        raise ValueError(f"{fn} splits the {h} query heads over {size} ranks: H must divide by the group size")
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"the number of query heads ({h}) must be a multiple of the number of kv heads ({h_kv})")


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      sm_scale: float | None = None, *, group=None, layout: str = "zigzag",
                      window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                      sinks: torch.Tensor | None = None, return_lse: bool = False, validate: bool = True):
    """Context-parallel attention by two all-to-alls over the ranks of `group` (any torch.distributed
    backend with all_to_all: NCCL, gloo). Shards as in ring_attention; H must divide by the group size W.
    GQA: the H_kv kv heads are split the same way when W divides H_kv; otherwise each kv head is repeated
    to the H query heads first (more traffic, the same result). Every variant of flash_attention applies
    on the whole sequence: causal, windows, softcap, sinks ((H,): each rank takes its heads' sinks).
    Arguments and validate as ring_attention's."""
    check_layout(layout)
    group = process_group(group)
    _, size = world(group)
    check_head_split("ulysses_attention", q, k, v, size)
    causal, sm_scale, left, right, softcap = attention_arguments(q, k, v, causal, sm_scale, window_size, softcap, None,
                                                                 sinks, any_device=True)
    return_lse = bool_flag("return_lse", return_lse)
    if bool_flag("validate", validate):
        same_on_every_rank("ulysses_attention", group, dict(q=q, k=k, v=v, sinks=sinks),
                           dict(causal=causal, sm_scale=sm_scale, softcap=softcap, left=left, right=right,
                                layout=layout, lse=return_lse))
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    if size == 1:
        out, lse = torch.ops.diyflash.attention_fwd(q, k, v, causal, scale, None, left, right, softcap,
                                                    None, sinks)
        return (out, lse) if return_lse else out
    qh, kh, vh, sinks = to_heads(q, k, v, sinks, group, layout)
    out, lse = torch.ops.diyflash.attention_fwd(qh, kh, vh, causal, scale, None, left, right, softcap,
                                                None, sinks)
    return to_sequence(out, lse, group, layout, return_lse)
