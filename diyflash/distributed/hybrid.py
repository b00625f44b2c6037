"""Hybrid context parallelism: Ulysses inside a node, a ring across nodes, on a 2-D mesh.

A sequence over W = W_ring x W_ulysses ranks: ring rank r holds its shard in the layout (zigzag or
contiguous over W_ring), cut into W_ulysses contiguous pieces across its Ulysses group (shard_sequence with
the mesh). An all-to-all inside the Ulysses group turns each piece into the whole ring shard of H/W_ulysses
heads; ring_attention runs over the ring group on those (every variant it takes: causal, windows, softcap,
sinks); a second all-to-all turns the output back. Only the ring's K/V shards (of a node's share of the
heads) cross nodes; the all-to-alls stay inside one.
"""

from __future__ import annotations

import torch

from ..api import attention_arguments
from .layout import check_layout, hybrid_groups, same_on_every_rank, world
from .ring import bool_flag, ring_attention
from .ulysses import check_head_split, to_heads, to_sequence


def hybrid_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     sm_scale: float | None = None, *, mesh, layout: str = "zigzag",
                     window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     sinks: torch.Tensor | None = None, return_lse: bool = False, validate: bool = True):
    """Context-parallel attention over a 2-D `mesh`: a torch.distributed DeviceMesh whose dim 0 is the ring
    (across nodes) and dim 1 Ulysses (inside a node), or a (ring group, Ulysses group) pair. q (B, H, n, D),
    k and v (B, H_kv, n, D[_v]) are this rank's shards (shard_sequence(x, mesh, layout=layout)); H must divide
    by the Ulysses size (kv heads are repeated to H where H_kv does not). Arguments, result and validate as
    ring_attention's."""
    check_layout(layout)
    groups = hybrid_groups(mesh)
    if groups is None:
        raise ValueError(f"mesh must be a 2-D DeviceMesh (ring, Ulysses) or a (ring group, Ulysses group) pair, "
                         f"got {type(mesh).__name__}")
    ring_group, ulysses_group = groups
    _, u_size = world(ulysses_group)
    check_head_split("hybrid_attention", q, k, v, u_size)  # over the Ulysses group
    causal, sm_scale, left, right, softcap = attention_arguments(q, k, v, causal, sm_scale, window_size, softcap,
                                                                 None, sinks, any_device=True)
    return_lse = bool_flag("return_lse", return_lse)
    if bool_flag("validate", validate):  # the ring group's ranks are compared by ring_attention below
        same_on_every_rank("hybrid_attention", ulysses_group, dict(q=q, k=k, v=v, sinks=sinks),
                           dict(causal=causal, sm_scale=sm_scale, softcap=softcap, left=left, right=right,
                                layout=layout, lse=return_lse))
    if u_size > 1:
        q, k, v, sinks = to_heads(q, k, v, sinks, ulysses_group, "contiguous")
    out, lse = ring_attention(q, k, v, causal, sm_scale, group=ring_group, layout=layout, window_size=(left, right),
                              softcap=softcap, sinks=sinks, return_lse=True, validate=validate)
    if u_size > 1:
        return to_sequence(out, lse, ulysses_group, "contiguous", return_lse)
    return (out, lse) if return_lse else out
