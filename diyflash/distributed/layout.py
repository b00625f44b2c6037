"""Sequence layouts of context parallelism and the communication the attentions share.

A sequence of N tokens over W ranks is cut into chunks: `contiguous`, W chunks, rank r holds chunk r;
`zigzag`, 2W chunks, rank r holds chunks r and 2W-1-r (in that order), so that under a causal mask every
rank has as much work as every other. shard_sequence / gather_sequence convert between the full
sequence and a rank's shard; `chunks_of` says which chunks a shard holds.
"""

from __future__ import annotations

import struct

import torch
import torch.distributed as dist

LAYOUTS = ("zigzag", "contiguous")


def process_group(group):
    """`group` as torch.distributed's calls take it: None (the default group) and process groups pass
    through; a 1-D DeviceMesh gives its group. A mesh of more dims is refused: it does not say which of its
    dims shards the sequence (hybrid_attention takes a 2-D one)."""
    if group is None or not dist.is_available():
        return group
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            names = f" (dims {group.mesh_dim_names})" if group.mesh_dim_names else ""
            raise ValueError(f"group: a {group.ndim}-D DeviceMesh of shape {tuple(group.shape)}{names} does not say "
                             "which of its dims shards the sequence; pass a 1-D mesh (mesh[\"name\"]) or a process "
                             "group (hybrid_attention takes a 2-D mesh)")
        return group.get_group()
    return group


def hybrid_groups(mesh) -> tuple | None:
    """(ring group, Ulysses group) of a 2-D DeviceMesh (dim 0 the ring, across nodes; dim 1 Ulysses, inside
    one: a mesh puts consecutive ranks, one node's GPUs, on its last dim) or of a pair of groups (or 1-D
    meshes); None for anything else (one group)."""
    if isinstance(mesh, (tuple, list)):
        if len(mesh) != 2:
            raise ValueError(f"a hybrid mesh as groups is a (ring group, Ulysses group) pair, got {len(mesh)} items")
        return process_group(mesh[0]), process_group(mesh[1])
    if mesh is None or not dist.is_available():
        return None
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(mesh, DeviceMesh) and mesh.ndim == 2:
        return mesh.get_group(0), mesh.get_group(1)
    return None


def world(group) -> tuple[int, int]:
    """(rank in group, group size); a single process without torch.distributed is (0, 1)."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def check_layout(layout) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def num_chunks(size: int, layout: str) -> int:
    return 2 * size if layout == "zigzag" else size


def chunks_of(rank: int, size: int, layout: str) -> tuple[int, ...]:
    """The chunk indices a rank's shard holds, in the shard's order."""
    return (rank, 2 * size - 1 - rank) if layout == "zigzag" else (rank,)


def _chunk_len(n: int, size: int, layout: str, what: str) -> int:
    parts = num_chunks(size, layout)
    if n % parts:
        raise ValueError(f"{what} ({n}) must divide into {parts} equal chunks (layout {layout!r} over {size} "
                         f"ranks)")
    return n // parts


def shard_sequence(x: torch.Tensor, group=None, dim: int = -2, layout: str = "zigzag") -> torch.Tensor:
    """This rank's shard of the full sequence x along dim: a view for `contiguous`, a copy (two chunks
    concatenated) for `zigzag`. The length must divide into the layout's chunks. With a 2-D mesh (or a
    (ring group, Ulysses group) pair; hybrid_attention): the ring rank's shard in `layout`, cut into equal
    contiguous pieces over the Ulysses group, of which this rank's."""
    check_layout(layout)
    groups = hybrid_groups(group)
    if groups is not None:
        ring_shard = shard_of(x, *world(groups[0]), dim, layout)
        return shard_of(ring_shard, *world(groups[1]), dim, "contiguous")
    return shard_of(x, *world(process_group(group)), dim, layout)


def shard_of(x: torch.Tensor, rank: int, size: int, dim: int, layout: str) -> torch.Tensor:
    """Rank `rank`'s shard (of `size`) of the full sequence x along dim (shard_sequence for any rank)."""
    c = _chunk_len(x.shape[dim], size, layout, f"the sequence length along dim {dim}")
    parts = [x.narrow(dim, i * c, c) for i in chunks_of(rank, size, layout)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def unshard(shards: list[torch.Tensor], dim: int, layout: str) -> torch.Tensor:
    """The full sequence from every rank's shard (shards[r] of rank r), along dim."""
    size = len(shards)
    per = len(chunks_of(0, size, layout))
    order: list[torch.Tensor | None] = [None] * num_chunks(size, layout)
    for r, shard in enumerate(shards):
        for piece, i in zip(shard.chunk(per, dim), chunks_of(r, size, layout)):
            order[i] = piece
    return torch.cat(order, dim)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, group, dim, layout):
        ctx.group, ctx.dim, ctx.layout = group, dim, layout
        _, size = world(group)
        shards = [torch.empty_like(shard) for _ in range(size)]
        dist.all_gather(shards, shard.contiguous(), group=group)
        return unshard(shards, dim, layout)

    @staticmethod
    def backward(ctx, grad):
        # every rank holds the whole sequence: the shard's gradient sums what each rank's use of it gave
        grad = grad.clone(memory_format=torch.contiguous_format)  # all_reduce writes in place: not autograd's tensor
        dist.all_reduce(grad, group=ctx.group)
        return shard_sequence(grad, ctx.group, ctx.dim, ctx.layout).contiguous(), None, None, None


def gather_sequence(shard: torch.Tensor, group=None, dim: int = -2, layout: str = "zigzag") -> torch.Tensor:
    """The full sequence on every rank from each rank's shard (all_gather). Differentiable: the
    shard's gradient is the sum over ranks of their gradients of its part (an all_reduce)."""
    check_layout(layout)
    groups = hybrid_groups(group)
    if groups is not None:  # the Ulysses group's pieces make the ring shard; the ring's shards the sequence
        return gather_sequence(gather_sequence(shard, groups[1], dim, "contiguous"), groups[0], dim, layout)
    group = process_group(group)
    _, size = world(group)
    if size == 1:
        return shard
    dim = dim % shard.dim()
    return _Gather.apply(shard, group, dim, layout)


def peer(group, rank: int) -> int:
    """A group rank's global rank (what point-to-point ops address)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def ring_shift(tensors: list[torch.Tensor], group, distance: int = 1):
    """Start sending each tensor `distance` ranks on along the ring (negative: back), and receiving the same
    shapes from `distance` ranks before. Returns (received buffers, requests): wait on the requests before
    reading the buffers. Asynchronous, so the caller computes while they travel. A distance that is a
    multiple of the group's size moves nothing: the tensors themselves come back, with no request."""
    if distance % world(group)[1] == 0:
        return list(tensors), []
    bufs = [torch.empty_like(t) for t in tensors]
    return bufs, exchange(tensors, bufs, group, distance)


def exchange(send: list[torch.Tensor], recv: list[torch.Tensor], group, distance: int) -> list:
    """Start sending `send` to the rank `distance` on along the ring and receiving `recv` (buffers of the
    shapes that rank's sender sends) from the rank `distance` before; returns the requests. Empty tensors
    are neither sent nor received (both sides know their shapes). Every rank must call it alike."""
    rank, size = world(group)
    to, frm = (rank + distance) % size, (rank - distance) % size
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer(group, to), group) for t in send if t.numel()]
    ops += [dist.P2POp(dist.irecv, b, peer(group, frm), group) for b in recv if b.numel()]
    return dist.batch_isend_irecv(ops) if ops else []


def wait(requests) -> None:
    for r in requests:
        r.wait()


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def same_on_every_rank(fn: str, group, tensors: dict, settings: dict) -> None:
    """Raise ValueError naming the first rank whose shards' shapes and dtypes, or whose settings (ints,
    floats, bools, strings), differ from rank 0's: one all_gather of a few int64s (on the GPU for NCCL, so
    reading it waits for the group's queued work). Shards of other shapes but the same byte count would
    otherwise travel and be read as garbage; other settings would compute something else on each rank."""
    rank, size = world(group)
    if size == 1:
        return
    row = []
    for t in tensors.values():
        dims = [] if t is None else list(t.shape)
        row += [len(dims), *dims, *[0] * (4 - len(dims)), -1 if t is None else _DTYPES.index(t.dtype)]
    for value in settings.values():
        if isinstance(value, str):
            value = sum(ord(c) << (8 * i) for i, c in enumerate(value[:7]))
        elif isinstance(value, float) or value is None:
            value = struct.unpack("<q", struct.pack("<d", float("nan") if value is None else value))[0]
        row.append(int(value))
    device = next(iter(tensors.values())).device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(rows, mine, group=group)
    table = torch.stack(rows).tolist()
    for r, other in enumerate(table):
        if other != table[0]:
            raise ValueError(f"{fn}: the ranks' calls differ: rank {r} has {_describe(other, tensors, settings)}, "
                             f"rank 0 has {_describe(table[0], tensors, settings)} (this is rank {rank}); every "
                             "rank must pass shards of one shape and dtype and the same arguments")


def _describe(row: list[int], tensors: dict, settings: dict) -> str:
    parts, i = [], 0
    for name in tensors:
        n = row[i]
        dims, dtype = row[i + 1:i + 1 + n], row[i + 5]
        parts.append(f"{name} None" if dtype < 0 else f"{name} {tuple(dims)} {_DTYPES[dtype]}")
        i += 6
    for name, value in zip(settings, row[i:]):
        parts.append(f"{name} #{value}")  # as encoded: enough to see which one differs
    return ", ".join(parts)
