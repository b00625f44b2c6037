"""Running sums of a ring's partial results, kept exactly as fp32 (fp64) sums of the parts would be.

A q chunk's output (merged by lse) and its dq gather one part per (q chunk, kv chunk) pair. The first part
that covers the whole chunk is kept as it came (the kernels' output dtype): a chunk with one pair, the
usual case under a sliding window, is never converted. A later part that covers a few rows (the corner of
the band a window leaves in a neighbour's chunk) is summed into an fp32 copy of those rows only; a later
part that covers the chunk converts it whole. The result is bitwise what converting the first part to
fp32 and summing every part in order would give.
"""

from __future__ import annotations

import torch


def part(t: torch.Tensor, box: tuple[int, int], dim: int = -2) -> torch.Tensor:
    """Rows box[0]..box[1] of a chunk (a view)."""
    return t.narrow(dim, box[0], box[1] - box[0])


def merge(acc, out, lse):
    """(out, lse) of two disjoint key sets merged: lse = log(e^lse1 + e^lse2), out their lse-weighted
    mean. Rows that saw no key in one part (lse -inf) take the other's values."""
    out0, lse0 = acc
    new = torch.logaddexp(lse0, lse)
    safe = torch.where(new == float("-inf"), 0.0, new)
    w0 = torch.exp(lse0 - safe).unsqueeze(-1)
    w1 = torch.exp(lse - safe).unsqueeze(-1)
    return out0 * w0 + out * w1, new


class ChunkSum:
    """The running sum of one chunk of c rows: a gradient (add) or an output with its lse (merge)."""

    def __init__(self, c: int, acc_t: torch.dtype):
        self.c, self.acc_t = c, acc_t
        self.base = None  # the chunk: the first whole part as it came, or acc_t
        self.lse = None  # merge only: the chunk's lse (acc_t, owned: written in place)
        self.top = None  # rows [lo, hi) of base in acc_t, where later parts landed (base not acc_t)
        self.lo = self.hi = 0

    def _start(self, t: torch.Tensor, lse: torch.Tensor | None, rows: tuple[int, int]) -> bool:
        """Take the first part; True when it was the whole of it (it is then the sum so far)."""
        if rows == (0, self.c):
            self.base, self.lse = t, lse
            return True
        self.base = t.new_zeros((*t.shape[:-2], self.c, t.shape[-1]), dtype=self.acc_t)
        if lse is not None:
            self.lse = lse.new_full((*lse.shape[:-1], self.c), float("-inf"))
        return False

    def _rows(self, rows: tuple[int, int]) -> torch.Tensor:
        """A writable acc_t view of these rows of the sum."""
        if rows == (0, self.c) and self.base.dtype != self.acc_t:
            self.base = self.exact()
            self.top = None
        if self.base.dtype == self.acc_t:
            return part(self.base, rows)
        lo, hi = rows if self.top is None else (min(rows[0], self.lo), max(rows[1], self.hi))
        if self.top is None or (lo, hi) != (self.lo, self.hi):
            top = part(self.base, (lo, hi)).to(self.acc_t, copy=True)
            if self.top is not None:
                part(top, (self.lo - lo, self.hi - lo)).copy_(self.top)
            self.top, self.lo, self.hi = top, lo, hi
        return part(self.top, (rows[0] - self.lo, rows[1] - self.lo))

    def add(self, t: torch.Tensor, rows: tuple[int, int]) -> None:
        if self.base is None and self._start(t, None, rows):
            return
        self._rows(rows).add_(t)

    def merge(self, out: torch.Tensor, lse: torch.Tensor, rows: tuple[int, int]) -> None:
        if self.base is None and self._start(out, lse, rows):
            return
        if rows == (0, self.c):
            self.base, self.lse = merge((self.exact(), self.lse), out, lse)
            self.top = None
            return
        view, l = self._rows(rows), part(self.lse, rows, -1)
        mo, ml = merge((view, l), out, lse)
        view.copy_(mo)
        l.copy_(ml)

    def exact(self) -> torch.Tensor:
        """The sum in acc_t."""
        if self.base.dtype == self.acc_t:
            return self.base
        whole = self.base.to(self.acc_t)
        if self.top is not None:
            part(whole, (self.lo, self.hi)).copy_(self.top)
        return whole

    def result(self, dtype: torch.dtype) -> torch.Tensor:
        """The sum in dtype (rounded once, as the acc_t sum converted would be)."""
        if self.top is not None and self.base.dtype == dtype:
            part(self.base, (self.lo, self.hi)).copy_(self.top)  # the parts' own tensor: ours to write
            self.top = None
            return self.base
        return self.exact().to(dtype)
