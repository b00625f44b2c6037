"""A randomized differential test (Hypothesis): shapes, strides (transposed, sliced and expanded views of
every tensor argument, index tensors included), dtypes, lengths (0, 1, odd), GQA ratios and the variants
drawn at random, through flash_attention, flash_attention_varlen and flash_attention_with_kvcache; out,
lse and every gradient against the float64 oracle under the 2x rule, cache appends against a PyTorch
replay. A fixed example budget: EXAMPLES on the CPU (CI, the interpreter), more on the GPU suite.
A failure Hypothesis finds becomes a named regression test (test_argument_rules.py); DIYFLASH_TRACE_CASES=1
prints each example as it starts, for device faults that surface only at a later call."""

import math
import os
import sys

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis", reason="the test extra: pip install 'diyflash[test]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import diyflash  # noqa: E402
from diyflash.reference import attention_ref, attention_varlen_ref  # noqa: E402
from diyflash.utils.validation import error_report  # noqa: E402
from helpers import ON_GPU, cancellation_bands  # noqa: E402
from conftest import DEVICE  # noqa: E402

EXAMPLES = 40 if ON_GPU else 30
LENGTHS = (0, 1, 2, 17, 113, 1023) if ON_GPU else (0, 1, 2, 5, 17)
HEAD_DIMS = (16, 32, 64, 80, 128) if ON_GPU else (16, 32)
GROUPS = (1, 4, 8) if ON_GPU else (1, 2, 4)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
VIEWS = ("contiguous", "transposed", "sliced", "expanded")
RUN = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, print_blob=True,
               suppress_health_check=list(HealthCheck))


def _view(base: torch.Tensor, view: str, batch_dim: int = 0) -> torch.Tensor:
    """A tensor equal to base, laid out as `view` says: contiguous, a transposed view of swapped storage,
    a slice of a wider buffer, or (where base is equal along batch_dim) an expanded view of one row."""
    if base.dim() == 0 or base.numel() == 0 or view == "contiguous":
        return base.contiguous()
    if view == "transposed" and base.dim() >= 2:
        return base.transpose(-1, -2).contiguous().transpose(-1, -2) if base.dim() == 2 else \
            base.transpose(1, 2).contiguous().transpose(1, 2)
    if view == "expanded" and base.shape[batch_dim] > 1 and bool((base == base.narrow(batch_dim, 0, 1)).all()):
        return base.narrow(batch_dim, 0, 1).expand(base.shape)
    wide = torch.zeros(*base.shape[:-1], base.shape[-1] * 2, dtype=base.dtype, device=base.device)
    wide[..., ::2] = base
    return wide[..., ::2]  # strided along the last dim, a copy of base's values


def _draw_tensor(draw, shape, dtype, seed, views=VIEWS, batch_dim=0):
    """Seeded random values of shape, equal along batch_dim when the drawn view is 'expanded'."""
    view = draw(st.sampled_from(views))
    gen = torch.Generator().manual_seed(seed)
    if view == "expanded":
        one = torch.randn(*shape[:batch_dim], 1, *shape[batch_dim + 1:], generator=gen)
        values = one.expand(shape).contiguous()
    else:
        values = torch.randn(shape, generator=gen)
    return _view(values.to(DEVICE, dtype), view, batch_dim)


def _index(draw, values: list[int]) -> torch.Tensor:
    """int32 values as a contiguous tensor, a strided column of a table, or (all equal) an expanded one."""
    t = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    return _view(t, draw(st.sampled_from(("contiguous", "sliced", "expanded"))))


def _variants(draw, h, batch):
    causal = draw(st.booleans())
    window = (draw(st.sampled_from((-1, 0, 3))), draw(st.sampled_from((-1, 0, 2)))) if draw(st.booleans()) else (-1, -1)
    softcap = draw(st.sampled_from((0.0, 0.0, 4.0)))
    alibi = None
    if draw(st.booleans()):
        shape = (h,) if draw(st.booleans()) else (batch, h)
        alibi = _view(torch.rand(shape, generator=torch.Generator().manual_seed(11)).to(DEVICE) * 0.5,
                      draw(st.sampled_from(("contiguous", "sliced", "transposed"))))
    sinks = None
    if draw(st.booleans()):
        sinks = _view(torch.randn(h, generator=torch.Generator().manual_seed(12)).to(DEVICE),
                      draw(st.sampled_from(("contiguous", "sliced"))))
    return causal, dict(window_size=window, softcap=softcap, alibi_slopes=alibi, sinks=sinks)


def _trace(case) -> None:
    """DIYFLASH_TRACE_CASES=1: each example's shapes, strides, dtypes and settings on stderr as it starts (with
    CUDA_LAUNCH_BLOCKING=1 the last one printed before a device fault is the example that caused it)."""
    if os.environ.get("DIYFLASH_TRACE_CASES"):
        def say(x):
            if isinstance(x, torch.Tensor):
                return f"T{tuple(x.shape)}s{x.stride()}{str(x.dtype)[6:]}"
            if isinstance(x, dict):
                return {k: say(v) for k, v in x.items()}
            if isinstance(x, (tuple, list)):
                return [say(v) for v in x]
            return x
        print("CASE", say(case), file=sys.stderr, flush=True)


def _assert_close(name, got, want, plain, extra_band=0.0):
    """got against the oracle under the 2x rule; -inf (rows that see no key) where the oracle has it."""
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), f"{name}: non-finite where the oracle is finite (or not)"
    if not finite.all():
        assert torch.equal(got[~finite].double(), want[~finite]), name
    got, want, plain = (t[finite] for t in (got, want, plain))
    report = error_report(name, got, want, plain)
    assert not report.has_nan and report.err <= report.bound + extra_band, str(report)


def _check_grads(fn, ref, leaves, sinks, out_dtype):
    """fn(*leaves) and ref(*leaves, upcast) each return (out, lse): out, lse and the gradients of a loss on
    both against the oracle (float64) and plain PyTorch in the inputs' dtype."""
    params = [sinks] if sinks is not None else []
    ours = [t.detach().requires_grad_() for t in leaves + params]
    out, lse = fn(*ours)
    gen = torch.Generator().manual_seed(5)
    dout = torch.randn(out.shape, generator=gen).to(DEVICE, out.dtype)
    dlse = torch.randn(lse.shape, generator=gen).to(DEVICE)
    oracle = [t.detach().double().requires_grad_() for t in leaves + params]
    plain = [t.detach().clone().requires_grad_() for t in leaves + params]
    want_out, want_lse = ref(*oracle, upcast=True)
    plain_out, plain_lse = ref(*plain, upcast=False)
    _assert_close("out", out, want_out.detach(), plain_out.detach())
    _assert_close("lse", lse, want_lse.detach(), plain_lse.detach().double())
    if out.numel() == 0:
        return

    def loss(o, l):  # noqa: E741  (the lse term only where it is finite)
        return (o * dout.to(o.dtype)).sum() + torch.where(torch.isfinite(l), l * dlse.to(l.dtype), 0.0).sum()

    got = torch.autograd.grad(loss(out, lse), ours, allow_unused=True)
    want = torch.autograd.grad(loss(want_out, want_lse), oracle, allow_unused=True)
    base = torch.autograd.grad(loss(plain_out, plain_lse), plain, allow_unused=True)
    four = [t if t.dim() == 4 else t.transpose(0, 1).unsqueeze(0) for t in (*leaves[:3], dout)]  # packed: (1, H, T, D)
    bands = cancellation_bands(*four, 1 / math.sqrt(leaves[0].shape[-1])) if all(t.numel() for t in four) else {}
    # dsinks = -sum p_sink (rowsum(dout * out) - dlse) reads the rounded out, as flash-attn's delta does, where
    # plain autograd differentiates through v: at most one rounding of out per term (heads are dim 1)
    terms = (dout.double() * out.detach().double()).abs().transpose(0, 1).flatten(1).sum(1)
    bands["dsinks"] = torch.finfo(out.dtype).eps * terms.max().item()
    for name, g, w, p in zip(("dq", "dk", "dv", "dsinks"), got, want, base):
        w = torch.zeros_like(g, dtype=torch.float64) if w is None else w
        p = torch.zeros_like(g) if p is None else p
        _assert_close(name, g, w, p, bands.get(name, 0.0))


@st.composite
def dense_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    b, h_kv, group = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2))), draw(st.sampled_from(GROUPS))
    h = h_kv * group
    n_q, n_k = draw(st.sampled_from(LENGTHS)), draw(st.sampled_from(LENGTHS))
    d = draw(st.sampled_from(HEAD_DIMS))
    dv = draw(st.sampled_from((d, 16)))
    q = _draw_tensor(draw, (b, h, n_q, d), dtype, 1)
    k = _draw_tensor(draw, (b, h_kv, n_k, d), dtype, 2)
    v = _draw_tensor(draw, (b, h_kv, n_k, dv), dtype, 3)
    causal, var = _variants(draw, h, b)
    seq_lens = None
    if n_q == n_k and n_k > 0 and draw(st.booleans()):
        seq_lens = _index(draw, [draw(st.integers(1, n_k)) for _ in range(b)])
    return q, k, v, causal, seq_lens, var


@RUN
@given(dense_cases())
def test_dense_matches_the_oracle(case):
    _trace(case)
    q, k, v, causal, seq_lens, var = case
    sinks = var.pop("sinks")

    def fn(q, k, v, *s):
        return diyflash.flash_attention(q, k, v, causal, seq_lens=seq_lens, sinks=s[0] if s else None,
                                        return_lse=True, **var)

    def ref(q, k, v, *s, upcast):
        out, lse = attention_ref(q, k, v, causal, None, seq_lens, upcast, sinks=s[0] if s else None, **var)
        if not upcast:
            out = out.to(q.dtype)
        return out, lse

    _check_grads(fn, ref, [q, k, v], sinks, q.dtype)


@st.composite
def varlen_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    h_kv, group = draw(st.sampled_from((1, 2))), draw(st.sampled_from(GROUPS))
    h = h_kv * group
    batch = draw(st.integers(1, 3))
    lens_q = [draw(st.sampled_from(LENGTHS)) for _ in range(batch)]
    lens_k = [draw(st.sampled_from(LENGTHS)) for _ in range(batch)]
    d = draw(st.sampled_from(HEAD_DIMS))
    views = ("contiguous", "transposed", "sliced")  # (T, H, D): no batch dim to expand
    q = _draw_tensor(draw, (sum(lens_q), h, d), dtype, 1, views)
    k = _draw_tensor(draw, (sum(lens_k), h_kv, d), dtype, 2, views)
    v = _draw_tensor(draw, (sum(lens_k), h_kv, d), dtype, 3, views)
    cu = [[0] + torch.tensor(lens).cumsum(0).tolist() for lens in (lens_q, lens_k)]
    causal, var = _variants(draw, h, batch)
    return q, k, v, _index(draw, cu[0]), _index(draw, cu[1]), max(lens_q), max(lens_k), causal, var


@RUN
@given(varlen_cases())
def test_varlen_matches_the_oracle(case):
    _trace(case)
    q, k, v, cu_q, cu_k, max_q, max_k, causal, var = case
    sinks = var.pop("sinks")

    def fn(q, k, v, *s):
        return diyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, sinks=s[0] if s else None,
                                               return_lse=True, **var)

    def ref(q, k, v, *s, upcast):
        out, lse = attention_varlen_ref(q, k, v, cu_q, cu_k, causal, None, upcast, sinks=s[0] if s else None, **var)
        return (out if upcast else out.to(q.dtype)), lse

    _check_grads(fn, ref, [q, k, v], sinks, q.dtype)


@st.composite
def kvcache_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    b, h_kv, group = draw(st.sampled_from((1, 2, 3))), draw(st.sampled_from((1, 2))), draw(st.sampled_from(GROUPS))
    h = h_kv * group
    d = draw(st.sampled_from(HEAD_DIMS))
    page = 16
    capacity = page * draw(st.integers(1, 4))
    n_q = draw(st.sampled_from((1, 1, 2, 5)))
    n_new = draw(st.sampled_from((0, 0, 1, n_q)))
    lens = [draw(st.integers(0, capacity - n_new)) for _ in range(b)]
    leftpad = [draw(st.integers(0, n + n_new)) for n in lens] if draw(st.booleans()) else None
    paged = draw(st.booleans())
    q = _draw_tensor(draw, (b, h, n_q, d), dtype, 1)
    cache_view = draw(st.sampled_from(("contiguous", "transposed", "sliced")))  # written: never expanded
    gen = torch.Generator().manual_seed(4)
    k_cache = _view(torch.randn(b, h_kv, capacity, d, generator=gen).to(DEVICE, dtype), cache_view)
    v_cache = _view(torch.randn(b, h_kv, capacity, d, generator=gen).to(DEVICE, dtype), cache_view)
    k_new = _draw_tensor(draw, (b, h_kv, n_new, d), dtype, 5) if n_new else None
    v_new = _draw_tensor(draw, (b, h_kv, n_new, d), dtype, 6) if n_new else None
    causal, var = _variants(draw, h, b)
    splits = draw(st.sampled_from((0, 1, 3)))
    return (q, k_cache, v_cache, _index(draw, lens), k_new, v_new, paged, page,
            None if leftpad is None else _index(draw, leftpad), causal, var, splits)


def _paged(cache: torch.Tensor, page: int, seed: int):
    """A contiguous cache's keys in a shuffled pool of pages (one spare), with its block table."""
    b, h_kv, capacity, d = cache.shape
    pages = capacity // page
    order = torch.randperm(b * pages + 1, generator=torch.Generator().manual_seed(seed))[:b * pages]
    pool = torch.zeros(b * pages + 1, h_kv, page, d, dtype=cache.dtype, device=cache.device)
    pool[order.to(cache.device)] = cache.unflatten(2, (pages, page)).permute(0, 2, 1, 3, 4).flatten(0, 1)
    return pool, order.view(b, pages).to(torch.int32).to(cache.device)


@RUN
@given(kvcache_cases())
def test_kvcache_matches_the_oracle_and_a_replay(case):
    _trace(case)
    q, k_cache, v_cache, lens, k_new, v_new, paged, page, leftpad, causal, var, splits = case
    b, h_kv, capacity, _ = k_cache.shape
    n_new = 0 if k_new is None else k_new.shape[2]
    # the replay: the caches after the append, in PyTorch
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i, n in enumerate(lens.tolist()):
        if n_new:
            want_k[i, :, n:n + n_new] = k_new[i]
            want_v[i, :, n:n + n_new] = v_new[i]
    if paged:
        kc, table = _paged(k_cache, page, 1)
        vc, _ = _paged(v_cache, page, 1)
        table = _view(table, "transposed")  # strided block tables too
    else:
        kc, vc, table = k_cache, v_cache, None
    out, lse = diyflash.flash_attention_with_kvcache(q, kc, vc, lens, k_new, v_new, block_table=table,
                                                     cache_leftpad=leftpad, causal=causal, return_lse=True,
                                                     num_splits=splits, **var)
    got_k, got_v = (c if not paged else c[table.long()].permute(0, 2, 1, 3, 4).flatten(2, 3) for c in (kc, vc))
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    for i, n in enumerate(lens.tolist()):
        end = n + n_new
        start = 0 if leftpad is None else int(leftpad[i])
        slopes = var["alibi_slopes"]
        kw = dict(var, alibi_slopes=slopes if slopes is None or slopes.dim() == 1 else slopes[i:i + 1])
        # keys [start, end), positions counted from 0: a left pad is keys no query sees
        keys, values = want_k[i:i + 1, :, :end], want_v[i:i + 1, :, :end]

        def ref(upcast, keys=keys, values=values, kw=kw, i=i, start=start):
            # keys before cache_leftpad are absent, and positions count from slot 0: dropping them keeps every
            # distance (causal and window bands aligned bottom-right, ALiBi), so this is the oracle
            qq, kk, vv = (t.double() if upcast else t for t in (q[i:i + 1], keys[:, :, start:], values[:, :, start:]))
            return attention_ref(qq, kk, vv, causal, None, None, upcast, **kw)

        want_out, want_lse = ref(True)
        plain_out, plain_lse = ref(False)
        _assert_close("out", out[i:i + 1], want_out, plain_out.to(q.dtype))
        _assert_close("lse", lse[i:i + 1], want_lse, plain_lse.double())

