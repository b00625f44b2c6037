"""Lazy rescaling of the forward's accumulator: the row max moves only by more than LAZY_SLACK, and a
warp whose rows all kept theirs skips the rescale by a branch (inline PTX: a warp vote, a predicated
multiply)."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)


LAZY_SLACK: tl.constexpr = tl.constexpr(8.0)


def _vote_asm(n: int) -> str:
    """PTX for one thread's n row flags ($n..$2n-1, int32): every output ($0..$n-1) is 1 when any row
    flag of any thread of the warp is set, else 0 (vote.sync.any: the same value in every lane)."""
    ors = "".join(f"or.b32 %t, %t, ${n + i};\n" for i in range(1, n))
    outs = "".join(f"mov.b32 ${i}, $0;\n" for i in range(1, n))
    return ("{\n.reg .pred %p;\n.reg .b32 %t;\n"
            f"mov.b32 %t, ${n};\n{ors}"
            "setp.ne.b32 %p, %t, 0;\nvote.sync.any.pred %p, %p, 0xffffffff;\n"
            f"selp.b32 $0, 1, 0, %p;\n{outs}}}")


def _rescale_asm(n: int) -> str:
    """PTX for n accumulator elements ($0..$n-1, tied to their inputs) times their row's alpha
    ($2n..$3n-1), skipped by a branch when the warp's flag ($3n, warp-uniform) is 0. A label inside a
    { } block is local to it, so the block can be inlined any number of times into one kernel."""
    muls = "".join(f"mul.f32 ${i}, ${i}, ${2 * n + i};\n" for i in range(n))
    return ("{\n.reg .pred %p;\n"
            f"setp.eq.b32 %p, ${3 * n}, 0;\n@%p bra SKIP;\n{muls}SKIP:\n}}")


VOTE_PACKS = (1, 2, 4)
RESCALE_N = 32  # accumulator elements per inline-asm block (a divisor of every lazy tile's per-thread count)
RESCALE_PACK: tl.constexpr = tl.constexpr(RESCALE_N)
_VOTE_1: tl.constexpr = tl.constexpr(_vote_asm(1))
_VOTE_2: tl.constexpr = tl.constexpr(_vote_asm(2))
_VOTE_4: tl.constexpr = tl.constexpr(_vote_asm(4))
_RESCALE: tl.constexpr = tl.constexpr(_rescale_asm(RESCALE_N))
_RESCALE_CONSTRAINTS: tl.constexpr = tl.constexpr(
    ",".join(["=f"] * RESCALE_N + [str(i) for i in range(RESCALE_N)] + ["f"] * RESCALE_N + ["r"] * RESCALE_N))


@triton.jit
def _warp_any(flag, ROWS: tl.constexpr):
    """flag: (BLOCK_M,) int32 of the rows' flags, in the accumulator's row layout, which gives each
    thread ROWS rows. Returns, for every row, whether any row of its warp has its flag set. ROWS must be
    every row a thread holds (vote_rows): pack=ROWS hands them all to one asm block, which ORs them before
    the vote; with fewer, each block would vote on part of them and a warp could skip a rescale one of its
    rows needs (test_lazy_rescaling_skips_only_warps_that_kept_every_max would see it, bit for bit)."""
    if ROWS == 1:
        out = tl.inline_asm_elementwise(_VOTE_1, "=r,r", [flag], dtype=tl.int32, is_pure=True, pack=1)
    elif ROWS == 2:
        out = tl.inline_asm_elementwise(_VOTE_2, "=r,=r,r,r", [flag], dtype=tl.int32, is_pure=True, pack=2)
    else:
        tl.static_assert(ROWS == 4)
        out = tl.inline_asm_elementwise(_VOTE_4, "=r,=r,=r,=r,r,r,r,r", [flag], dtype=tl.int32, is_pure=True,
                                        pack=4)
    return out


@triton.jit
def _rescale(acc, alpha, grew, VOTE_ROWS: tl.constexpr):
    """acc * alpha[:, None]. VOTE_ROWS (compiled kernels with lazy rescaling: the rows each thread holds,
    see _warp_any; 0 = a plain multiply): alpha is exactly 1 on every row that did not grow (`grew`), and
    a warp none of whose rows grew skips the multiply by a branch, which gives the same bits."""
    if VOTE_ROWS:
        warp_grew = _warp_any(grew.to(tl.int32), ROWS=VOTE_ROWS)
        acc = tl.inline_asm_elementwise(_RESCALE, _RESCALE_CONSTRAINTS,
                                        [acc, alpha[:, None], warp_grew[:, None]],
                                        dtype=tl.float32, is_pure=True, pack=RESCALE_PACK)
    else:
        acc = acc * alpha[:, None]
    return acc
