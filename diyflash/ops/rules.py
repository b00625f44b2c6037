"""The rules every tensor argument of every diyflash op follows, in one table.

Every op's implementation (the function its CUDA/CPU kernel, the API's eager shortcut and the autograd
formula's eager backward all call) passes its small tensors through `for_kernels` and its written
caches through `written_error`; the shape, dtype and device rules are ops/checks.py's, which the API,
the ops and their fakes share. tests/test_argument_rules.py fails when an op's schema names a tensor
argument this table lacks, so a new argument cannot skip the rules.

- data: q, k, v, out, dout, a, b, any strides (stride 0 too: an expanded view, a `.sum()` gradient),
  read in place; lse and dlse likewise.
- index: int32 tensors of a few integers each (lengths, offsets, page numbers), any strides: a strided
  one (a column of a table) is copied to unit stride before any kernel reads it (B to B x pages
  integers). Values outside their range are clamped by the kernels (nothing is read or written out of
  bounds) and checked by the API where it says so (validate: on the device, or on the host with "sync").
- param: fp32 per-head values (ALiBi slopes (H,) or (B, H), sinks (H,)), any strides, copied to unit
  stride like index tensors. A sink of +inf (or one too large for base-2 arithmetic) holds all of its
  row's mass: the output is 0 and lse the sink, on every route.
- written: k_cache and v_cache, which an append writes in place. Written, they must not overlap in
  memory, themselves (an expanded view: every batch row would write one slot) or each other, nor the
  new keys and values read from them; reading alone (no append) takes any view.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Rule(NamedTuple):
    kind: str  # "data", "index", "param" or "written" (see the module docstring)
    what: str


RULES: dict[str, Rule] = {
    **{name: Rule("data", "read in place, any strides")
       for name in ("q", "k", "v", "out", "dout", "lse", "dlse", "a", "b")},
    **{name: Rule("index", "int32, any strides: copied to unit stride for the kernels")
       for name in ("seq_lens", "cu_seqlens_q", "cu_seqlens_k", "cache_seqlens", "cache_leftpad", "block_table")},
    **{name: Rule("param", "fp32 per head, any strides: copied to unit stride for the kernels")
       for name in ("alibi_slopes", "sinks")},
    **{name: Rule("written", "written in place by an append: no overlap")
       for name in ("k_cache", "v_cache")},
}

# softcap's bounds: the kernels take cap2 = softcap * log2(e) as an fp32 scalar, finite within these (2.35e38 *
# log2(e) = 3.39e38 < fp32's largest, 3.40e38); 1 / cap2 is subnormal past softcap ~5.9e37, which the kernels
# keep (kernels.attention.semantics._inv, _mul_exact)
MIN_SOFTCAP = float(torch.finfo(torch.float32).tiny)
MAX_SOFTCAP = 2.35e38


def softcap_error(softcap) -> str | None:
    """softcap is 0 (off) or within [MIN_SOFTCAP, MAX_SOFTCAP] (a Python or symbolic float)."""
    if not (softcap == 0 or MIN_SOFTCAP <= softcap <= MAX_SOFTCAP):  # NaN fails both
        return (f"softcap must be 0 (off) or in [{MIN_SOFTCAP:.3g}, {MAX_SOFTCAP:.3g}] (finite in fp32, also "
                f"times log2(e)), got {softcap}")
    return None


def for_kernels(t: torch.Tensor | None) -> torch.Tensor | None:
    """An index or param tensor as the kernels read it: unit stride (a copy of its few numbers where it is
    strided), or None."""
    if t is None or t.is_contiguous():
        return t
    return t.contiguous()


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] element offsets that t touches in its storage (strides are never negative)."""
    first = t.storage_offset()
    return first, first + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _reaches(delta: int, dims: list[tuple[int, int, int]]) -> bool:
    """Whether delta = sum c_d * stride_d for integers lo_d <= c_d <= hi_d (dims: (stride, lo, hi), largest
    stride first). A dim's coefficient is bounded by what the smaller dims can still add: a few candidates
    a dim, else (dims that interleave densely) a conservative True."""
    if not dims:
        return delta == 0
    (stride, lo, hi), rest = dims[0], dims[1:]
    most = sum(h * s for s, _, h in rest)
    least = sum(lo_ * s for s, lo_, _ in rest)
    lo = max(lo, -((most - delta) // stride))  # the least c with delta - c * stride <= most
    hi = min(hi, (delta - least) // stride)  # the largest c with delta - c * stride >= least
    if hi - lo > 3:
        return True
    return any(_reaches(delta - c * stride, rest) for c in range(lo, hi + 1))


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b may share an element of memory: the same storage and intersecting spans, unless
    they have one element size and one set of strides and no pair of their indices lands on one element
    (K and V interleaved in one (.., 2, H, D) buffer, or the two halves of one buffer, are disjoint)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a_lo, a_hi), (b_lo, b_hi) = _span(a), _span(b)
    size_a, size_b = a.element_size(), b.element_size()
    if a_hi * size_a + size_a <= b_lo * size_b or b_hi * size_b + size_b <= a_lo * size_a:
        return False  # byte ranges apart
    if size_a != size_b or a.dim() != b.dim() or a.stride() != b.stride():
        return True  # intersecting ranges of other layouts: not proven apart
    # a's element i and b's element j coincide iff sum (i_d - j_d) stride_d = b's offset - a's offset
    dims = sorted(((s, -(m - 1), n - 1) for s, n, m in zip(a.stride(), a.shape, b.shape) if s > 0 and (n > 1 or m > 1)),
                  reverse=True)
    return _reaches(b_lo - a_lo, dims)


def written_error(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None) -> str | None:
    """The written rule: where an append writes the caches (k and v given), None when no element of memory
    is written twice or both written and read, else the sentence naming the tensors. Eager and
    implementation-side (it reads storage addresses); the fakes check what shapes and strides show."""
    error = written_shape_error(k_cache, v_cache, k)  # an expanded cache, one tensor as both (or no append)
    if error or k is None:
        return error
    pairs = (("k_cache", k_cache, "v_cache", v_cache), ("k", k, "k_cache", k_cache), ("k", k, "v_cache", v_cache),
             ("v", v, "k_cache", k_cache), ("v", v, "v_cache", v_cache))
    for name_a, a, name_b, b in pairs:
        if overlap(a, b):
            what = "write both at once" if name_a.endswith("cache") else f"write {name_b} while reading {name_a}"
            return f"{name_a} and {name_b} overlap in memory: the append would {what}; give them disjoint memory"
    return None


def written_shape_error(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None) -> str | None:
    """What the written rule can tell from shapes and strides alone (the fakes): an expanded cache, or one
    tensor given as both caches."""
    if k is None:
        return None
    if k_cache is v_cache:
        return "k_cache and v_cache overlap in memory (one tensor given as both): the append writes both at once"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride())):
            return (f"{name} overlaps itself in memory (an expanded view, strides {tuple(t.stride())}): the append "
                    "would write several rows' keys into one slot; append into a cache of its own (.clone())")
    return None
