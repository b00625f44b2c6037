"""KV-cache attention (issue 25): diyflash.flash_attention_with_kvcache and diyflash::attention_with_kvcache
against the dense float64 oracle on each batch's first cache_seqlens[b] + N_new keys (2x-plain-PyTorch
rule), decode (N_q = 1) and speculative (N_q = 3..8) steps, appends in place, contiguous and paged caches
(page sizes 16 and 256, shuffled block tables, paged == contiguous bitwise), GQA, windows, softcap,
ALiBi, sinks, split-KV (forced and chosen), the cache contents after the call, opcheck with the mutation,
compile, CUDA-graph capture, errors and clamping. The same file runs on CPU (interpreter) and on CUDA.
"""

import threading

import pytest
import torch

import diyflash
from diyflash.reference import attention_ref
from diyflash.utils.validation import error_report
from helpers import ON_GPU


def _randn(shape, dtype, device, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


class Case:
    """A batch of caches with their new keys: contiguous (B, H_kv, N_cache, D) viewed from (B, N_cache,
    H_kv, D) storage, and the same keys paged into a shuffled pool of pages."""

    def __init__(self, b=3, h=8, h_kv=2, n_q=1, n_new=1, d=16, dv=None, lens=(10, 0, 90), capacity=128,
                 page_size=16, dtype=torch.float16, device="cpu", seed=0, leftpad=None):
        dv = d if dv is None else dv
        self.b, self.h, self.h_kv, self.n_q, self.n_new, self.d, self.dv = b, h, h_kv, n_q, n_new, d, dv
        self.capacity, self.page_size = capacity, page_size
        self.q = _randn((b, h, n_q, d), dtype, device, seed)
        self.k_cache = _randn((b, capacity, h_kv, d), dtype, device, seed + 1).transpose(1, 2)
        self.v_cache = _randn((b, capacity, h_kv, dv), dtype, device, seed + 2).transpose(1, 2)
        self.k = _randn((b, h_kv, n_new, d), dtype, device, seed + 3) if n_new else None
        self.v = _randn((b, h_kv, n_new, dv), dtype, device, seed + 4) if n_new else None
        self.seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        self.leftpad = None if leftpad is None else torch.tensor(leftpad, dtype=torch.int32, device=device)
        pages = capacity // page_size
        gen = torch.Generator(device="cpu").manual_seed(seed + 5)
        order = torch.randperm(b * pages + 3, generator=gen)[:b * pages]  # a pool with 3 pages no batch uses
        self.block_table = order.view(b, pages).to(torch.int32).to(device)
        pool = b * pages + 3
        self.k_pages = _randn((pool, h_kv, page_size, d), dtype, device, seed + 6)
        self.v_pages = _randn((pool, h_kv, page_size, dv), dtype, device, seed + 7)
        for cache, pages_ in ((self.k_cache, self.k_pages), (self.v_cache, self.v_pages)):
            for i in range(b):  # the same keys in both layouts
                blocks = cache[i].unflatten(1, (pages, page_size)).transpose(0, 1)  # (pages, H_kv, page, D)
                pages_[self.block_table[i].long()] = blocks

    def caches(self, paged):
        if paged:
            return self.k_pages.clone(), self.v_pages.clone(), self.block_table
        return (self.k_cache.clone().transpose(1, 2).contiguous().transpose(1, 2),
                self.v_cache.clone().transpose(1, 2).contiguous().transpose(1, 2), None)

    def dense_keys(self):
        """(k, v) of every batch after the append, as (B, H_kv, capacity, D) in float64."""
        k, v = self.k_cache.double().clone(), self.v_cache.double().clone()
        for i in range(self.b):
            s = int(self.seqlens[i])
            if self.n_new:
                k[i, :, s:s + self.n_new] = self.k[i].double()
                v[i, :, s:s + self.n_new] = self.v[i].double()
        return k, v

    def run(self, paged=False, **kw):
        k_cache, v_cache, bt = self.caches(paged)
        if self.q.dtype == torch.float64:  # the op itself: the API takes fp16, bf16 and fp32
            out, lse = torch.ops.diyflash.attention_with_kvcache(
                self.q, k_cache, v_cache, self.seqlens, self.k, self.v, bt, kw["causal"], None, *kw["window_size"],
                kw["softcap"], kw["alibi_slopes"], kw["sinks"], kw["num_splits"], self.leftpad)
        else:
            out, lse = diyflash.flash_attention_with_kvcache(self.q, k_cache, v_cache, self.seqlens, self.k, self.v,
                                                             block_table=bt, cache_leftpad=self.leftpad,
                                                             return_lse=True, **kw)
        return out, lse, k_cache, v_cache


def _oracle(case, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None, sinks=None, upcast=True):
    k, v = case.dense_keys()
    outs, lses = [], []
    for i in range(case.b):
        n = int(case.seqlens[i]) + case.n_new
        start = 0 if case.leftpad is None else int(case.leftpad[i])  # a left-padded batch: its keys from there
        q = case.q[i:i + 1]
        kk, vv = k[i:i + 1, :, start:n], v[i:i + 1, :, start:n]
        if not upcast:
            kk, vv = kk.to(q.dtype), vv.to(q.dtype)
        al = alibi if alibi is None or alibi.dim() == 1 else alibi[i:i + 1]
        o, l = attention_ref(q, kk, vv, causal, scale, None, upcast, window_size=window, softcap=softcap,
                             alibi_slopes=al, sinks=sinks)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def check(case, paged=False, **kw):
    ref_kw = {name: kw[name] for name in ("causal", "window", "softcap", "alibi", "sinks") if name in kw}
    api_kw = dict(causal=kw.get("causal", False), window_size=kw.get("window", (-1, -1)),
                  softcap=kw.get("softcap", 0.0), alibi_slopes=kw.get("alibi"), sinks=kw.get("sinks"),
                  num_splits=kw.get("num_splits", 0))
    out, lse, k_cache, v_cache = case.run(paged, **api_kw)
    want, want_lse = _oracle(case, **ref_kw)
    plain, _ = _oracle(case, upcast=False, **ref_kw)
    report = error_report("out", out, want, plain)
    assert report.ok, str(report)
    assert out.shape == (case.b, case.h, case.n_q, case.dv) and out.dtype == case.q.dtype
    lse_dtype = torch.float64 if case.q.dtype == torch.float64 else torch.float32
    assert lse.shape == (case.b, case.h, case.n_q) and lse.dtype == lse_dtype
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    # the cache after the call: the new keys at cache_seqlens[b] + j, nothing else changed
    k_want, v_want = case.dense_keys()
    if paged:
        pages = case.capacity // case.page_size
        k_cache = torch.stack([k_cache[case.block_table[i].long()].transpose(0, 1).flatten(1, 2)
                               for i in range(case.b)])
        v_cache = torch.stack([v_cache[case.block_table[i].long()].transpose(0, 1).flatten(1, 2)
                               for i in range(case.b)])
        assert k_cache.shape[2] == pages * case.page_size
    assert torch.equal(k_cache.double(), k_want) and torch.equal(v_cache.double(), v_want)
    return out, lse


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("n_q", [1, 3, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_decode(device, paged, n_q, causal):
    case = Case(n_q=n_q, n_new=n_q, device=device)
    check(case, paged, causal=causal)


@pytest.mark.parametrize("h,h_kv", [(4, 4), (8, 1), (8, 2)])
def test_gqa_packing(device, h, h_kv):
    case = Case(h=h, h_kv=h_kv, n_q=2, n_new=2, device=device)
    check(case, causal=True)


def test_without_new_keys(device):
    case = Case(n_q=4, n_new=0, lens=(17, 1, 128), device=device)
    check(case, causal=True)
    check(case, True, causal=True)


@pytest.mark.parametrize("window", [(8, -1), (4, 0), (20, 3)])
def test_window(device, window):
    case = Case(n_q=3, n_new=3, device=device)
    check(case, True, causal=window[1] == 0, window=window)


def test_every_variant(device):
    case = Case(h=4, h_kv=2, n_q=5, n_new=2, d=16, dv=8, device=device, dtype=torch.float32)
    slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625]] * 3, device=device) * torch.tensor([[1.0], [0.5], [2.0]],
                                                                                          device=device)
    sinks = torch.tensor([0.3, -1.0, 2.0, 0.0], device=device)
    for paged in (False, True):
        check(case, paged, causal=True, window=(30, -1), softcap=3.0, alibi=slopes, sinks=sinks, num_splits=3)


@pytest.mark.parametrize("splits", [1, 2, 5, 0])
def test_split_kv(device, splits):
    """A long cache cut into ranges and merged by lse: every split count gives the oracle's answer; sinks
    enter once (in the merge)."""
    case = Case(n_q=2, n_new=2, lens=(300, 7, 509), capacity=512, device=device)
    sinks = torch.tensor([0.5] * 8, device=device)
    check(case, causal=True, sinks=sinks, num_splits=splits)


def test_page_size_256_and_paged_equals_contiguous_bitwise(device):
    case = Case(n_q=3, n_new=3, lens=(200, 0, 509), capacity=512, page_size=256, device=device)
    for splits in (1, 3):
        paged = check(case, True, causal=True, num_splits=splits)
        dense = check(case, False, causal=True, num_splits=splits)
        assert all(torch.equal(a, b) for a, b in zip(paged, dense))
    case16 = Case(n_q=1, n_new=1, lens=(33, 100, 0), page_size=16, device=device)
    for splits in (1, 4):
        assert all(torch.equal(a, b) for a, b in zip(case16.run(True, num_splits=splits)[:2],
                                                      case16.run(False, num_splits=splits)[:2]))


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("n_q,splits", [(1, 1), (1, 4), (3, 0)])
def test_left_padded_cache(device, paged, n_q, splits):
    """cache_leftpad: batch b attends to keys cache_leftpad[b] .. cache_seqlens[b] + N_new - 1, what the
    oracle gets from those keys alone (causal, window and ALiBi distances unchanged); starts inside a 64-key
    step, at 0, and at the last key (with N_q = 3 the first rows see none)."""
    case = Case(n_q=n_q, n_new=n_q, lens=(100, 0, 300), capacity=512, leftpad=(37, 0, 299 + n_q), device=device)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625] * 2, device=device)
    check(case, paged, causal=True, num_splits=splits)
    check(case, paged, causal=True, window=(70, -1), alibi=slopes, sinks=torch.full((8,), 0.5, device=device),
          num_splits=splits)


def test_left_padded_cache_paged_equals_contiguous_and_zero_pad_is_none(device):
    case = Case(n_q=2, n_new=2, lens=(100, 5, 300), capacity=512, page_size=64, leftpad=(64, 6, 1), device=device)
    for splits in (1, 3):
        assert all(torch.equal(a, b) for a, b in zip(case.run(True, causal=True, num_splits=splits)[:2],
                                                      case.run(False, causal=True, num_splits=splits)[:2]))
    case.leftpad.zero_()
    padded = case.run(False, causal=True)[:2]
    case.leftpad = None
    assert all(torch.equal(a, b) for a, b in zip(padded, case.run(False, causal=True)[:2]))


def test_a_row_padded_past_its_keys_sees_none(device):
    """cache_leftpad = cache_seqlens + N_new: no key; output 0 and lse -inf (the sink's logit with sinks),
    split or not."""
    case = Case(n_q=1, n_new=1, lens=(10, 0, 90), leftpad=(11, 0, 3), device=device)
    for splits in (1, 2):
        out, lse, _, _ = case.run(False, num_splits=splits)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isneginf(lse[0]).all()
        out, lse, _, _ = case.run(False, sinks=torch.full((8,), 0.25, device=device), num_splits=splits)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(lse[0], torch.full_like(lse[0], 0.25))


def test_rows_that_see_no_key(device):
    case = Case(n_q=1, n_new=0, lens=(0, 5, 0), device=device)
    out, lse, _, _ = case.run(False, sinks=torch.zeros(8, device=device))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(lse[0], torch.zeros_like(lse[0]))
    out, lse, _, _ = case.run(True)
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()


@pytest.mark.parametrize("page_size", [16, 64])  # 64: a page holds whole steps of the decode kernel (ONE_PAGE)
def test_out_of_range_values_are_clamped_not_read(device, page_size):
    """Unchecked values (as while capturing): a length past the capacity, a negative one, a page entry past
    the pool. The op clamps: no write outside the cache, finite output, untouched pages unchanged."""
    case = Case(n_q=1, n_new=2, lens=(127, -5, 10), page_size=page_size, device=device)
    k_pages, v_pages, bt = case.caches(True)
    bt = bt.clone()
    bt[2, 0] = 10_000
    unused = sorted(set(range(k_pages.shape[0])) - set(case.block_table.flatten().tolist()))
    guard = k_pages[unused].clone(), v_pages[unused].clone()  # the pages no batch uses
    out, lse = torch.ops.diyflash.attention_with_kvcache(case.q, k_pages, v_pages, case.seqlens, case.k, case.v, bt)
    assert torch.isfinite(out).all()
    leftpad = torch.tensor([-3, 1000, 5], dtype=torch.int32, device=device)  # before the cache, past it, inside
    out, lse = torch.ops.diyflash.attention_with_kvcache(case.q, k_pages, v_pages, case.seqlens, case.k, case.v, bt,
                                                         cache_leftpad=leftpad)
    assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(k_pages[unused], guard[0]) and torch.equal(v_pages[unused], guard[1])
    with pytest.raises(ValueError, match=r"cache_seqlens must be >= 0, got cache_seqlens\[1\] = -5"):
        diyflash.flash_attention_with_kvcache(case.q, k_pages, v_pages, case.seqlens, case.k, case.v, block_table=bt)
    pool = k_pages.shape[0]
    with pytest.raises(ValueError, match=rf"block_table\[2, 0\] = 10000 is not a page of the cache \(0..{pool - 1}\)"):
        diyflash.flash_attention_with_kvcache(case.q, k_pages, v_pages, case.seqlens.clamp(0, 100), case.k, case.v,
                                              block_table=bt, cache_leftpad=torch.zeros_like(case.seqlens))


# ---- the op: opcheck (with the mutation), compile, autocast, errors ----------------------------------


@pytest.mark.parametrize("splits", [1, 3])
def test_raw_dot_past_fp32_range_stays_finite(device, splits):
    """Issue 23, item 9, in the decode kernel: q of 3e19 against new keys of 3e19 (raw q.k 9e38, past
    fp32's range; scaled by 1/8, 1.1e38, inside it) is finite and meets the error rule against plain
    PyTorch that scales q first (exact at head_dim 64), split or not."""
    case = Case(d=64, n_q=2, n_new=2, dtype=torch.bfloat16, device=device)
    case.q[:, :, 1, 0] = 3e19
    case.q[:, ::3, 0, 0] = -3e19
    case.k[:, :, 0, 0] = 3e19
    out, lse, _, _ = case.run(False, causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                              num_splits=splits)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    want, want_lse = _oracle(case, causal=True)
    q = case.q
    case.q = q * 0.125
    plain, _ = _oracle(case, causal=True, scale=1.0, upcast=False)
    case.q = q
    report = error_report("out", out, want, plain)
    assert report.ok, str(report)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("paged,leftpad", [(False, None), (True, None), (False, (3, 0, 64))])
def test_opcheck(device, paged, leftpad):
    case = Case(n_q=2, n_new=2, device=device, dtype=torch.float32, leftpad=leftpad)
    k_cache, v_cache, bt = case.caches(paged)
    args = (case.q, k_cache, v_cache, case.seqlens, case.k, case.v, bt, True, None, 8, -1, 0.0, None,
            torch.zeros(8, device=device), 2, case.leftpad)
    torch.library.opcheck(torch.ops.diyflash.attention_with_kvcache.default, args, test_utils="ALL")


@pytest.mark.parametrize("leftpad", [None, (2, 0, 0)])
def test_compile_decode_loop(device, leftpad):
    """A decode loop under torch.compile(fullgraph=True): the cache writes happen in the compiled graph,
    0 graph breaks, and the steps equal the eager ones (with cache_leftpad too)."""
    torch._dynamo.reset()
    case = Case(n_q=1, n_new=1, lens=(5, 9, 0), device=device, leftpad=leftpad)

    def step(q, k_cache, v_cache, seqlens, k, v):
        return diyflash.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k, v, causal=True,
                                                     cache_leftpad=case.leftpad)

    compiled = torch.compile(step, fullgraph=True)
    caches_c, caches_e = case.caches(False)[:2], case.caches(False)[:2]
    seqlens = case.seqlens.clone()
    for i in range(4):
        q, k, v = (_randn(t.shape, t.dtype, device, 100 + i) for t in (case.q, case.k, case.v))
        got = compiled(q, *caches_c, seqlens, k, v)
        want = step(q, *caches_e, seqlens, k, v)
        assert torch.equal(got, want)
        seqlens += 1
    assert all(torch.equal(a, b) for a, b in zip(caches_c, caches_e))
    explain = torch._dynamo.explain(step)(case.q, *case.caches(False)[:2], case.seqlens, case.k, case.v)
    assert explain.graph_break_count == 0


class _DecodeStep(torch.nn.Module):
    def forward(self, q, k_cache, v_cache, seqlens, k, v, block_table, leftpad):
        return diyflash.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k, v, block_table=block_table,
                                                     cache_leftpad=leftpad, causal=True, window_size=(40, -1))


@pytest.mark.parametrize("paged", [False, True])
def test_export_keeps_the_op_and_its_cache_writes(device, paged):
    """torch.export of a decode step: diyflash::attention_with_kvcache stays in the graph (writing the caches in
    place), and after run_decompositions as a functionalized call whose writes into k_cache and v_cache the
    program records as input mutations. Both programs, run on other values (other q, new keys, lengths,
    starts), give the eager step's output and leave the same caches."""
    traced = Case(n_q=2, n_new=2, device=device, leftpad=(3, 0, 64))
    k_cache, v_cache, table = traced.caches(paged)
    args = (traced.q, k_cache, v_cache, traced.seqlens, traced.k, traced.v, table, traced.leftpad)
    ep = torch.export.export(_DecodeStep(), args)
    assert "torch.ops.diyflash.attention_with_kvcache.default" in str(ep.graph)
    functional = ep.run_decompositions()
    assert "diyflash.attention_with_kvcache" in str(functional.graph)
    assert set(functional.graph_signature.user_inputs_to_mutate.values()) == {"k_cache", "v_cache"}
    other = Case(n_q=2, n_new=2, lens=(30, 7, 90), device=device, seed=20, leftpad=(0, 2, 5))
    want_caches = other.caches(paged)
    want = _DecodeStep()(other.q, *want_caches[:2], other.seqlens, other.k, other.v, want_caches[2], other.leftpad)
    for program in (ep, functional):
        caches = other.caches(paged)
        got = program.module()(other.q, *caches[:2], other.seqlens, other.k, other.v, caches[2], other.leftpad)
        assert torch.equal(got, want)
        assert torch.equal(caches[0], want_caches[0]) and torch.equal(caches[1], want_caches[1])


def test_autocast(device):
    dtype = torch.bfloat16
    case = Case(n_q=2, n_new=2, device=device, dtype=dtype)
    q32, k32, v32 = case.q.float(), case.k.float(), case.v.float()
    k_cache, v_cache, _ = case.caches(False)
    with torch.autocast(device.type, dtype=dtype):
        out = diyflash.flash_attention_with_kvcache(q32, k_cache, v_cache, case.seqlens, k32, v32)
    assert out.dtype == dtype
    want = diyflash.flash_attention_with_kvcache(case.q, *case.caches(False)[:2], case.seqlens, case.k, case.v)
    assert torch.equal(out, want)


def _errors(case, device):
    i32 = dict(dtype=torch.int32, device=device)
    return [
        (dict(k_cache=case.k_cache[:, :, :, :8]), ValueError, "q and k_cache must have one head_dim"),
        (dict(k_cache=case.k_cache[:2], v_cache=case.v_cache[:2]), ValueError, "k_cache must have q's batch 3"),
        (dict(cache_seqlens=case.seqlens.long()), TypeError, "cache_seqlens must be an int32 tensor"),
        (dict(k=None), ValueError, "k and v must be given together"),
        (dict(block_table=case.block_table.long()), TypeError, "block_table must be an int32 tensor"),
        (dict(block_table=case.block_table[:2]), ValueError, "block_table must have shape (3, max_pages)"),
        (dict(num_splits=-1), ValueError, "num_splits must be an int in [0, 1024]"),
        (dict(k=case.k[0], v=case.v[0]), ValueError, "k and v must be 4-D (B, H_kv, N_new, D)"),
        (dict(v=case.v[:, :1]), ValueError, "k and v must have shapes"),
        (dict(cache_seqlens=torch.tensor([10, -1, 3], **i32)), ValueError,
         "cache_seqlens must be >= 0, got cache_seqlens[1] = -1"),
        (dict(cache_seqlens=torch.tensor([10, 128, 3], **i32)), ValueError,
         "cache_seqlens[1] + N_new = 129 exceeds the cache's capacity (128 keys)"),
        (dict(cache_leftpad=torch.tensor([0, 0], **i32)), ValueError, "cache_leftpad must have shape (3,), got (2,)"),
        (dict(cache_leftpad=torch.tensor([0, 2, 0], **i32)), ValueError,
         "cache_leftpad[1] = 2 must be in [0, cache_seqlens[1] + N_new = 1] (the first key of batch 1)"),
        (dict(cache_leftpad=torch.tensor([0, 0, 0], dtype=torch.int64, device=device)), TypeError,
         "cache_leftpad must be an int32 tensor"),
    ]


VALUE_ERRORS = (9, 10, 12)


@pytest.mark.parametrize("i", range(14))
def test_errors_name_the_values(device, i):
    case = Case(device=device)
    kw, exc, phrase = _errors(case, device)[i]
    a = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, cache_seqlens=case.seqlens, k=case.k, v=case.v,
             block_table=None, num_splits=0, cache_leftpad=None)
    a.update(kw)
    with pytest.raises(exc) as api:
        diyflash.flash_attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["k"], a["v"],
                                              block_table=a["block_table"], num_splits=a["num_splits"],
                                              cache_leftpad=a["cache_leftpad"])
    assert phrase in str(api.value)
    if i in VALUE_ERRORS:
        return  # values: the API checks them eagerly; the op never syncs to read them (the kernels clamp)
    args = (a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["k"], a["v"], a["block_table"], False, None,
            -1, -1, 0.0, None, None, a["num_splits"], a["cache_leftpad"])
    with pytest.raises(exc) as op:
        torch.ops.diyflash.attention_with_kvcache(*args)
    assert phrase in str(op.value) and "diyflash::attention_with_kvcache" in str(op.value)


def test_pytorch_path_matches_the_kernels(torch_path):
    case = Case(n_q=3, n_new=3, dtype=torch.float64)
    for paged in (False, True):
        check(case, paged, causal=True, window=(40, -1), sinks=torch.zeros(8, dtype=torch.float64))
    case.leftpad = torch.tensor([4, 0, 33], dtype=torch.int32)
    check(case, True, causal=True, window=(40, -1), sinks=torch.zeros(8, dtype=torch.float64))


# ---- GPU only: a 64k cache, a captured decode loop -----------------------------------------------------


@pytest.mark.skipif(not ON_GPU, reason="a 64k-token cache: the interpreter would take minutes")
def test_long_cache_gpu(device):
    case = Case(b=2, h=32, h_kv=8, n_q=1, n_new=1, d=128, lens=(65535, 40000), capacity=65536, page_size=256,
                dtype=torch.bfloat16, device=device)
    for paged in (False, True):
        check(case, paged, causal=True)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("leftpad", [False, True])
def test_cuda_graph_decode_loop_of_32_steps(device, leftpad):
    """32 decode steps captured in one CUDA graph (the lengths advance on the device) equal the eager loop;
    with leftpad, a left-padded batch (cache_leftpad, read on the device at every replay) under a window,
    as a static cache's compiled decode step of transformers runs it."""
    case = Case(b=2, h=8, h_kv=2, n_q=1, n_new=1, d=64, lens=(100, 3), capacity=256, page_size=16,
                dtype=torch.bfloat16, device=device, leftpad=(37, 2) if leftpad else None)
    extra = dict(cache_leftpad=case.leftpad, window_size=(40, -1)) if leftpad else {}
    steps = 32
    qs = _randn((steps, *case.q.shape), case.q.dtype, device, 11)
    ks = _randn((steps, *case.k.shape), case.k.dtype, device, 12)
    vs = _randn((steps, *case.v.shape), case.v.dtype, device, 13)

    def loop(k_cache, v_cache, bt, seqlens, outs):
        for i in range(steps):
            outs[i] = diyflash.flash_attention_with_kvcache(qs[i], k_cache, v_cache, seqlens, ks[i], vs[i],
                                                            block_table=bt, causal=True, **extra)
            seqlens += 1

    eager_cache = case.caches(True)
    eager_outs = torch.empty(steps, *case.q.shape, dtype=case.q.dtype, device=device)
    loop(*eager_cache, case.seqlens.clone(), eager_outs)
    eager_first = eager_outs[0].clone()

    graph_cache = case.caches(True)
    seqlens = case.seqlens.clone()
    outs = torch.empty_like(eager_outs)
    loop(*case.caches(True), case.seqlens.clone(), torch.empty_like(eager_outs))  # warm-up: compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loop(*graph_cache, seqlens, outs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(outs, eager_outs)
    assert torch.equal(graph_cache[0], eager_cache[0]) and torch.equal(graph_cache[1], eager_cache[1])
    if leftpad:  # other pad counts written into the captured tensor: the replay reads them
        case.leftpad.copy_(torch.tensor([90, 0], dtype=torch.int32))
        eager_cache = case.caches(True)
        loop(*eager_cache, case.seqlens.clone(), eager_outs)
        for dst, src in zip(graph_cache[:2], case.caches(True)[:2]):
            dst.copy_(src)
        seqlens.copy_(case.seqlens)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(outs, eager_outs) and not torch.equal(outs[0], eager_first)


@pytest.mark.skipif(not ON_GPU, reason="the partials are kept for CUDA streams only (the interpreter's are per call)")
def test_split_partials_are_kept_per_stream(device, monkeypatch):
    """Split-KV's partials live in buffers kept per (device, stream, thread) between eager calls: calls of
    other shapes and split counts in a row share them (growing them where needed), each bit-identical to the
    same call with fresh buffers. A call on another stream gets buffers of its own, so does a call from
    another thread, and a captured call its graph's own (the kept ones are not touched)."""
    from diyflash.kernels.attention import kvcache as kv

    monkeypatch.setattr(kv, "_KEPT", {})
    cases = [(Case(device=device, seed=0), 4), (Case(b=2, h=8, h_kv=8, lens=(100, 5), device=device, seed=1), 7),
             (Case(n_q=3, n_new=3, device=device, seed=2), 2), (Case(d=64, dv=32, device=device, seed=3), 33),
             (Case(device=device, seed=0), 4)]

    def call(case, splits):
        k_cache, v_cache, _ = case.caches(False)
        return diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, case.k, case.v,
                                                     causal=True, num_splits=splits,
                                                     sinks=torch.zeros(case.h, device=device), return_lse=True)

    kept = [call(case, splits) for case, splits in cases]
    key = (torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream, threading.get_ident())
    assert sorted(kv._KEPT) == [(*key, "lse partials"), (*key, "out")]
    buffers = dict(kv._KEPT)
    assert buffers[(*key, "out")].numel() == max(c.b * c.h * c.n_q * s * c.dv for c, s in cases)  # the largest
    for (case, splits), (out, lse) in zip(cases, kept):
        monkeypatch.setattr(kv, "_KEPT", {})
        fresh_out, fresh_lse = call(case, splits)
        assert torch.equal(out, fresh_out) and torch.equal(lse, fresh_lse)
    monkeypatch.setattr(kv, "_KEPT", dict(buffers))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out, lse = call(*cases[0])
    torch.cuda.current_stream().wait_stream(side)
    assert {k[:3] for k in kv._KEPT} == {key, (key[0], side.cuda_stream, key[2])}
    assert all(kv._KEPT[k] is buf for k, buf in buffers.items())
    assert torch.equal(out, kept[0][0]) and torch.equal(lse, kept[0][1])
    results = []
    worker = threading.Thread(target=lambda: results.append(call(*cases[0])))
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert len({k[:3] for k in kv._KEPT}) == 3 and all(kv._KEPT[k] is buf for k, buf in buffers.items())
    assert torch.equal(results[0][0], kept[0][0]) and torch.equal(results[0][1], kept[0][1])
    before = {k: id(buf) for k, buf in kv._KEPT.items()}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call(*cases[0])
    graph.replay()
    torch.cuda.synchronize()
    assert {k: id(buf) for k, buf in kv._KEPT.items()} == before
    assert torch.equal(out, kept[0][0]) and torch.equal(lse, kept[0][1])


@pytest.mark.skipif(not ON_GPU, reason="CUDA-graph trees need a GPU")
def test_reduce_overhead_compile_of_a_split_decode_step(device, monkeypatch):
    """torch.compile(mode="reduce-overhead") (CUDA-graph trees, as transformers' static cache generates)
    of a split-KV decode step writing into static caches: the warmup runs the op eagerly with allocations
    routed to the graphs' pool, which must hold no buffer beyond the call, so calls through the op keep
    none (a kept partials buffer made the tree refuse: "tensor(s) in the cudagraph pool not tracked as
    outputs"). Warmup, recording and replays on new values equal the eager steps, outputs and caches, and
    the step is not kept out of CUDA graphs."""
    from torch._dynamo.utils import counters

    from diyflash.kernels.attention import kvcache as kv

    monkeypatch.setattr(kv, "_KEPT", {})  # a kept buffer already big enough would hide an allocation
    torch._dynamo.reset()
    counters.clear()
    case = Case(b=2, h=8, h_kv=2, lens=(100, 37), capacity=256, d=64, dtype=torch.bfloat16, device=device)
    graph_cache, eager_cache = case.caches(False)[:2], case.caches(False)[:2]
    for t in graph_cache:
        torch._dynamo.mark_static_address(t)

    def step(q, k, v, k_cache, v_cache, seqlens):
        return diyflash.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k, v, causal=True, num_splits=4)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):  # warmup, recording, replays
        q, k, v = (_randn(t.shape, t.dtype, device, 20 + 3 * i + j) for j, t in enumerate((case.q, case.k, case.v)))
        seqlens = case.seqlens + i
        got = compiled(q, k, v, *graph_cache, seqlens).clone()
        assert kv._KEPT == {}
        want = step(q, k, v, *eager_cache, seqlens)  # the eager API's shortcut keeps its scratch
        kv._KEPT.clear()
        assert torch.equal(got, want)
    assert torch.equal(graph_cache[0], eager_cache[0]) and torch.equal(graph_cache[1], eager_cache[1])
    assert counters["inductor"]["cudagraph_skips"] == 0
    torch._dynamo.reset()


@pytest.mark.skipif(not ON_GPU, reason="the scratch lse is kept for CUDA streams only")
@pytest.mark.parametrize("splits", [1, 4])
def test_an_lse_nobody_asked_for_goes_to_a_kept_buffer(device, monkeypatch, splits):
    """Without return_lse, an eager call's lse is written to a kept scratch buffer instead of a fresh
    tensor (one allocation less a decode step): the output is bit-identical to the call with return_lse,
    for flash_attention_with_kvcache and for the dense API's decode route (a q of one row)."""
    from diyflash.kernels.attention import kvcache as kv

    monkeypatch.setattr(kv, "_KEPT", {})
    case = Case(device=device)
    k_cache, v_cache, _ = case.caches(False)
    out, _ = diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, causal=True,
                                                   num_splits=splits, return_lse=True)
    assert not any(slot == "lse" for *_, slot in kv._KEPT)
    alone = diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, causal=True,
                                                  num_splits=splits)
    assert any(slot == "lse" for *_, slot in kv._KEPT)
    assert torch.equal(alone, out)
    monkeypatch.setattr(kv, "_KEPT", {})
    with torch.no_grad():
        dense, lse = diyflash.flash_attention(case.q, k_cache, v_cache, causal=True, return_lse=True)
        assert not any(slot == "lse" for *_, slot in kv._KEPT)
        assert torch.equal(diyflash.flash_attention(case.q, k_cache, v_cache, causal=True), dense)
        assert any(slot == "lse" for *_, slot in kv._KEPT)


@pytest.mark.skipif(not ON_GPU, reason="plans bind compiled kernels; the interpreter has none")
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("splits", [1, 4])
def test_repeated_calls_replay_their_plan(device, monkeypatch, paged, splits):
    """An eager decode loop's host cost (issue 25): a call with the layouts of an earlier one replays
    that call's bound launches (append, decode, combine) with the new pointers. Bit-identical to the
    same call planned afresh, for other q, new keys, lengths and caches of the same layouts."""
    from diyflash.kernels.attention import kvcache as kv

    replays = []
    real = kv.replay_with
    monkeypatch.setattr(kv, "replay_with", lambda plan, env, args: replays.append(1) or real(plan, env, args))
    monkeypatch.setattr(kv, "_KV_PLANS", {})
    first, second = Case(n_new=2, device=device, seed=0), Case(n_new=2, lens=(3, 50, 7), device=device, seed=10)

    def call(case):
        k_cache, v_cache, table = case.caches(paged)
        out, lse = diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, case.k, case.v,
                                                         block_table=table, causal=True, num_splits=splits,
                                                         return_lse=True)
        return out, lse, k_cache, v_cache

    call(first)
    assert len(kv._KV_PLANS) == 1 and not replays
    replayed = call(second)
    assert replays == [1]
    monkeypatch.setattr(kv, "_KV_PLANS", {})
    fresh = call(second)
    assert replays == [1] and len(kv._KV_PLANS) == 1  # planned afresh, not replayed
    for a, b in zip(replayed, fresh):
        assert torch.equal(a, b)


@pytest.mark.skipif(not ON_GPU, reason="plans bind compiled kernels; the interpreter has none")
@pytest.mark.parametrize("window", [(-1, -1), (40, 0)])
def test_a_growing_cache_replays_the_plan_of_its_length_class(device, monkeypatch, window):
    """transformers' DynamicCache hands each decode step a contiguous cache one token longer (new length,
    new strides): the dense route's call then replays an earlier call's kernels with its own arguments
    where the lengths and strides have the classes Triton compiled for (not across a multiple of 16) and
    the split count is the same. Bit-identical to the same call planned afresh, and right by the oracle."""
    from diyflash.kernels.attention import kvcache as kv

    replays = []
    real = kv.replay_with
    monkeypatch.setattr(kv, "replay_with", lambda plan, env, args: replays.append(1) or real(plan, env, args))
    q = _randn((2, 8, 1, 64), torch.bfloat16, device, 0)
    keys = _randn((2, 2, 560, 64), torch.bfloat16, device, 1)
    values = _randn((2, 2, 560, 64), torch.bfloat16, device, 2)
    lengths = (520, 521, 530, 528, 529, 540)  # 528 = 33 * 16: another class; 4 splits throughout

    def step(n):
        return diyflash.flash_attention(q, keys[:, :, :n].contiguous(), values[:, :, :n].contiguous(), causal=True,
                                        window_size=window)

    monkeypatch.setattr(kv, "_KV_PLANS", {})
    grown = [step(n) for n in lengths]
    assert len(replays) == 4 and len(kv._KV_PLANS) == 2  # 520 and 528 plan, the others replay
    for n, out in zip(lengths, grown):
        monkeypatch.setattr(kv, "_KV_PLANS", {})
        assert torch.equal(out, step(n))
        k, v = keys[:, :, :n], values[:, :, :n]
        ref, _ = attention_ref(q, k, v, True, window_size=window)
        plain, _ = attention_ref(q, k, v, True, upcast=False, window_size=window)
        report = error_report(f"out at {n} keys", out, ref, plain)
        assert report.ok, str(report)


def test_split_count_and_stages_fill_whole_waves(monkeypatch):
    """The launch shape rule (kvcache.py, measured in bench/results/decode_probe_h200.txt): a grid smaller
    than the GPU is split into one whole wave of programs, one an SM (four for a paged cache, whose
    block-table loads need the company), never below MIN_KEYS_PER_SPLIT keys a split, at most MAX_SPLITS; an
    unsplit grid of more than two programs an SM pipelines 2 stages deep (three programs an SM), any other 3."""
    from types import SimpleNamespace

    from diyflash.kernels.attention import kvcache as kv

    monkeypatch.setattr(kv, "device_limits", lambda device: SimpleNamespace(sms=132))
    monkeypatch.setattr(kv, "INTERPRETED", False)
    cuda = torch.device("cuda", 0)
    assert kv.num_splits_for(1, 8, 1, 65536, cuda) == 16  # 128 programs: one wave
    assert kv.num_splits_for(1, 8, 1, 65536, cuda, paged=True) == 64  # 66 for four an SM, MAX_SPLITS
    assert kv.num_splits_for(8, 8, 1, 65536, cuda, paged=True) == 8  # 512: four an SM (floor)
    assert kv.num_splits_for(1, 8, 1, 4096, cuda, paged=True) == 32  # 128 keys a split
    assert kv.num_splits_for(8, 8, 1, 8192, cuda) == 2  # not 5 (320 programs: a partial second wave)
    assert kv.num_splits_for(1, 8, 1, 1024, cuda) == 8  # 128 keys a split
    assert kv.num_splits_for(1, 8, 1, 200, cuda) == 1
    assert kv.num_splits_for(32, 8, 1, 2048, cuda) == 1  # the grid fills the GPU
    assert kv.decode_stages(512, 1, cuda) == 2 and kv.decode_stages(264, 1, cuda) == 3
    assert kv.decode_stages(64, 5, cuda) == 3
