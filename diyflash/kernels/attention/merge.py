"""The merge of a split forward's pieces: where the Hopper forward (forward_sm90.py) cuts its last round of
tiles into runs of key blocks (tile_order._work: without it, a call whose tiles are not a multiple of the
programs leaves most SMs idle for the last round), each piece of a tile holds its rows' normalized fp32 output
and lse, and this launch merges a tile's pieces (semantics._merge_rows, in rank order: the bits depend on the
values alone) into out and lse."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)

from .semantics import _merge_rows  # noqa: E402
from .tile_order import _tile_at  # noqa: E402


@triton.jit
def _attn_merge_pieces_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, lse_ptr,
    stride_oz, stride_oh, stride_om, stride_od, stride_lz, stride_lh,
    seq_len_q, num_tiles, num_heads, first_lin, blocks, split_blocks, max_pieces,
    BLOCK_M: tl.constexpr, HEAD_DIM_V: tl.constexpr, ROWS: tl.constexpr, PIECES_PAD: tl.constexpr,
):
    """Tile first_lin + r's (r: program_id(0); _tile_at's order, head after head) rows program_id(1) * ROWS
    onward: its pieces (tile_order._work: the runs of split_blocks key blocks that fall in its `blocks`, at
    part_o (pieces, BLOCK_M, HEAD_DIM_V) and part_lse (pieces, BLOCK_M) from r * max_pieces) merged into out and
    lse; a row marked by a piece (a NaN lse) stays marked for the second pass."""
    r = tl.program_id(0)
    pid_m, off_h, off_z = _tile_at(first_lin + r, num_tiles, num_heads, 0, 1, DEAL=False, REVERSE=False)
    first_run = (r * blocks) // split_blocks
    pieces = ((r + 1) * blocks - 1) // split_blocks - first_run + 1
    local = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    rows = pid_m * BLOCK_M + local
    row_ok = rows < seq_len_q
    at = r.to(tl.int64) * max_pieces * BLOCK_M + local
    offs_dv = tl.arange(0, HEAD_DIM_V)
    out, lse = _merge_rows(part_o_ptr + at * HEAD_DIM_V, part_lse_ptr + at, row_ok, 0.0, pieces,
                           BLOCK_M * HEAD_DIM_V, BLOCK_M, offs_dv, offs_dv < HEAD_DIM_V, SINKS=False,
                           SPLITS_PAD=PIECES_PAD, MARKS=True)
    o_rows = off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh + rows.to(tl.int64) * stride_om
    tl.store(out_ptr + o_rows[:, None] + offs_dv[None, :] * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(lse_ptr + off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + rows, lse, mask=row_ok)
