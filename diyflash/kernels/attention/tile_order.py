"""The order in which a kernel's programs take their tiles, as @triton.jit helpers every attention kernel shares:
a grid's program ids dealt over head groups (causal tiles, of unequal work, heavy first: _tile, _tile_at), a
persistent kernel's turns (_turns, _turn) and the last round cut into runs of key blocks (_work, _piece_keys).
The numbers they take (head groups, programs, the split) are chosen on the host: grids.py, hopper.py."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)


@triton.jit
def _tile(head_group, DEAL: tl.constexpr, REVERSE: tl.constexpr):
    """This program's (tile, head, batch) on a (tiles, heads, batch) grid. CUDA starts programs in
    linear order, axis 0 fastest; they are dealt out in groups of `head_group` heads, and within a
    group rank r of every head comes before rank r + 1. A causal kernel's tiles differ in work by rank
    (the last query blocks see the most keys: REVERSE; the first key blocks are seen by the most
    queries), so the heavy tiles of a whole group start first and the grid ends on light ones, while
    the group's streamed rows stay in L2 together. head_group = 1: one head after the other.
    Not DEAL: the program ids as they are, head after head (tiles of equal work need no dealing, and
    computing dealt ids cost the non-causal D64 backward ~358 -> ~326 TFLOPS on the H200)."""
    if not DEAL:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_tiles = tl.num_programs(0)
    num_heads = tl.num_programs(1)
    lin = tl.program_id(0) + num_tiles * (tl.program_id(1) + num_heads * tl.program_id(2).to(tl.int64))
    return _tile_at(lin, num_tiles, num_heads, num_heads * tl.num_programs(2), head_group, DEAL=True,
                    REVERSE=REVERSE)


@triton.jit
def _tile_at(lin, num_tiles, num_heads, num_bh, head_group, DEAL: tl.constexpr, REVERSE: tl.constexpr):
    """_tile's (tile, head, batch) of the lin-th program of a (num_tiles, num_heads, num_bh / num_heads)
    grid in CUDA's start order: what a persistent kernel's program takes for its lin-th tile."""
    if not DEAL:
        bh = lin // num_tiles
        return lin - bh * num_tiles, bh % num_heads, bh // num_heads
    per_group = num_tiles * head_group
    group = lin // per_group
    first = group * head_group
    size = tl.minimum(num_bh - first, head_group)
    r = lin - group * per_group
    rank = (r // size).to(tl.int32)
    bh = (first + r % size).to(tl.int32)
    if REVERSE:
        tile = num_tiles - 1 - rank
    else:
        tile = rank
    return tile, bh % num_heads, bh // num_heads


@triton.jit
def _group_turns(num_tiles, head_group):
    """DEAL's turns a program takes in each head group (_turn): a pair for every 2P of the group's tiles."""
    return 2 * tl.cdiv(num_tiles * head_group, 2 * tl.num_programs(0))


@triton.jit
def _turns(num_tiles, num_bh, head_group, DEAL: tl.constexpr):
    """How many turns (_turn) a persistent kernel's program takes over a (num_tiles, heads, batch) grid's
    num_tiles x num_bh tiles, its num_programs(0) programs side by side."""
    if DEAL:
        return tl.cdiv(num_bh, head_group) * _group_turns(num_tiles, head_group)
    else:
        return tl.cdiv(num_tiles * num_bh, tl.num_programs(0))


@triton.jit
def _turn(i, num_tiles, num_bh, head_group, DEAL: tl.constexpr):
    """(lin, whether this turn has a tile) of this program's i-th turn: the lin-th tile of _tile_at's order.
    Not DEAL (tiles of equal work): tiles in turns, program p taking p, p + P, p + 2P, ... DEAL (a causal
    kernel's, heavy first within each head group): each group on its own, its tiles dealt out back and forth,
    program p taking group positions p and 2P - 1 - p of every 2P, so that one heavy and one light tile make
    each program's pair (a group holds at least 2P tiles: hopper.schedule) and the programs stay in step
    group after group; every other group deals from the last program, so that the light tiles of a group's
    short last round fall on other programs each time."""
    p = tl.program_id(0)
    programs = tl.num_programs(0)
    if DEAL:
        per_group = _group_turns(num_tiles, head_group)
        group = i // per_group
        s = i - group * per_group
        p = tl.where(group % 2 == 0, p, programs - 1 - p)  # a group's last, short pair: other programs each time
        j = 2 * programs * (s // 2) + tl.where(s % 2 == 0, p, 2 * programs - 1 - p)
        size = tl.minimum(num_bh - group * head_group, head_group)
        return group * head_group * num_tiles + j, j < size * num_tiles
    else:
        lin = p + i * programs
        return lin, lin < num_tiles * num_bh


@triton.jit
def _work_turns(num_tiles, num_bh, head_group, split_blocks, DEAL: tl.constexpr, SPLIT: tl.constexpr):
    """_turns, where with SPLIT a split_blocks > 0 cuts the last round (_work): the whole rounds, then two."""
    if SPLIT:
        whole = num_tiles * num_bh // tl.num_programs(0)
        return tl.where(split_blocks > 0, whole + 2, _turns(num_tiles, num_bh, head_group, DEAL=DEAL))
    else:
        return _turns(num_tiles, num_bh, head_group, DEAL=DEAL)


@triton.jit
def _work(i, num_tiles, num_bh, head_group, blocks, split_blocks, max_pieces, DEAL: tl.constexpr,
          SPLIT: tl.constexpr):
    """(lin, live, first, end, piece) of this program's i-th turn: _turn's tile, whose key blocks [first, end)
    of its `blocks` it computes, and piece -1 (the whole tile, blocks [0, blocks)). With SPLIT (tiles of equal
    work: not DEAL) and split_blocks > 0, the turns after the whole rounds split the last round's R tiles:
    their R x blocks key blocks, tile after tile, are cut into runs of split_blocks (<= blocks), program p
    taking run p, which falls in at most two tiles (its turns whole and whole + 1); a piece of a tile is
    numbered r * max_pieces + its rank among the tile's runs (r: the tile's place in the last round), where
    its partial rows go for the merge (merge.py), max_pieces being the most runs any tile falls in."""
    lin, live = _turn(i, num_tiles, num_bh, head_group, DEAL=DEAL)
    first = lin * 0  # (tensors from the start: the branch below assigns them)
    end = first + blocks
    piece = first - 1
    if SPLIT:
        programs = tl.num_programs(0)
        p = tl.program_id(0)
        total = num_tiles * num_bh
        whole = total // programs
        if (split_blocks > 0) & (i >= whole):
            start = p * split_blocks
            stop = tl.minimum(start + split_blocks, (total - whole * programs) * blocks)
            r = start // blocks + (i - whole)
            first = tl.maximum(start - r * blocks, 0)
            end = tl.minimum(stop - r * blocks, blocks)
            lin = whole * programs + r
            live = first < end
            piece = r * max_pieces + p - (r * blocks) // split_blocks
    return lin, live, first, end, piece


@triton.jit
def _piece_keys(lo, hi, first, end, BLOCK_N: tl.constexpr):
    """A tile's key range [lo, hi) (_band's) cut to its blocks [first, end) (_work's)."""
    return lo + first * BLOCK_N, tl.minimum(hi, lo + end * BLOCK_N)
