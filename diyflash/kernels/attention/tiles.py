"""How the kernels read their tiles: masked pointer loads, TMA descriptors (built per program or on the
host), 32- or 64-bit row offsets. Shared by the forward and both backward kernels."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)


@triton.jit
def _load(ptrs, mask, UPCAST: tl.constexpr):
    # UPCAST: only under Triton's interpreter, whose bf16 tl.dot is wrong (triton-lang/triton#11584);
    # bf16 tiles are widened to fp32 right after the load there. Compiled kernels never take it.
    if mask is None:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _rows_desc(base, rows, row_stride, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """A TMA descriptor over one (z, h) slice: `rows` rows of HEAD_DIM contiguous elements, read in
    (BLOCK, HEAD_DIM_PAD) tiles. The hardware fills rows >= `rows` and columns >= HEAD_DIM with zeros,
    so a slice's valid length (seq_lens) is its shape and tail tiles need no load masks. At least one
    row: a descriptor of an empty slice is never read, but must still be valid."""
    return tl.make_tensor_descriptor(base, shape=[tl.maximum(rows, 1), HEAD_DIM], strides=[row_stride, 1],
                                     block_shape=[BLOCK, HEAD_DIM_PAD])


@triton.jit
def _streamed(base, rows, row_stride, d_stride, offs_r, offs_d,
              HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              TRANSPOSED: tl.constexpr, TMA: tl.constexpr):
    """Where a loop's streamed (BLOCK, HEAD_DIM) tiles come from: a TMA descriptor, or the pointer tile
    of the first block ((D, BLOCK) when TRANSPOSED), which the loop advances."""
    if TMA:
        src = _rows_desc(base, rows, row_stride, HEAD_DIM=HEAD_DIM, BLOCK=BLOCK, HEAD_DIM_PAD=HEAD_DIM_PAD)
    elif TRANSPOSED:
        src = base + offs_r[None, :] * row_stride + offs_d[:, None] * d_stride
    else:
        src = base + offs_r[:, None] * row_stride + offs_d[None, :] * d_stride
    return src


@triton.jit
def _desc_load(desc, row, UPCAST: tl.constexpr):
    x = desc.load([row, 0])
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _desc_load4(desc, z, h, row, UPCAST: tl.constexpr):
    """The (BLOCK, HEAD_DIM_PAD) tile at `row` of slice (z, h) from a host-built descriptor over the whole
    (Z, H, N, D) tensor (host_descriptor), whose blocks are (1, 1, BLOCK, HEAD_DIM_PAD). Rows >= N and
    columns >= D read as zeros, per slice: a tail tile never reaches into the next head."""
    x = desc.load([z, h, row, 0])
    x = x.reshape(x.shape[2], x.shape[3])
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _stepped(a_ptrs, b_ptrs, start, step_a, step_b, ROWOFF: tl.constexpr, ROW32: tl.constexpr):
    """The pointer tiles of the streamed block at row `start`. ROWOFF: a_ptrs and b_ptrs are the first
    block's tiles, offset here by the row offset start * step (AttnConfig.rowoff), in 64 bits unless
    ROW32; else the loop advances them and they are already there."""
    if ROWOFF:
        if ROW32:
            return a_ptrs + start * step_a, b_ptrs + start * step_b
        return a_ptrs + tl.cast(start, tl.int64) * step_a, b_ptrs + tl.cast(start, tl.int64) * step_b
    return a_ptrs, b_ptrs


@triton.jit
def _rows(offs, ROW32: tl.constexpr):
    """Row indices to multiply by a row stride: as they are when ROW32 (the launcher checked that every
    offset inside a (batch, head) slice fits in int32: rows_fit_int32), else widened to 64 bits."""
    if ROW32:
        rows = offs
    else:
        rows = offs.to(tl.int64)
    return rows
