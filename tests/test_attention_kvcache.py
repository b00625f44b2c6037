"""KV-cache attention (issue 25): diyflash.flash_attention_with_kvcache and diyflash::attention_with_kvcache
against the dense float64 oracle on each batch's first cache_seqlens[b] + N_new keys (2x-plain-PyTorch
rule), decode (N_q = 1) and speculative (N_q = 3..8) steps, appends in place, contiguous and paged caches
(page sizes 16 and 256, shuffled block tables, paged == contiguous bitwise), GQA, windows, softcap,
ALiBi, sinks, split-KV (forced and chosen), the cache contents after the call, opcheck with the mutation,
compile, CUDA-graph capture, errors and clamping. The same file runs on CPU (interpreter) and on CUDA.
"""

import pytest
import torch

import diyflash
from diyflash.utils.validation import error_report
from helpers import ON_GPU, KVCase, check_kvcache, kvcache_oracle, seeded_randn


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("n_q", [1, 3, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_decode(device, paged, n_q, causal):
    case = KVCase(n_q=n_q, n_new=n_q, device=device)
    check_kvcache(case, paged, causal=causal)


@pytest.mark.parametrize("h,h_kv", [(4, 4), (8, 1), (8, 2)])
def test_gqa_packing(device, h, h_kv):
    case = KVCase(h=h, h_kv=h_kv, n_q=2, n_new=2, device=device)
    check_kvcache(case, causal=True)


def test_without_new_keys(device):
    case = KVCase(n_q=4, n_new=0, lens=(17, 1, 128), device=device)
    check_kvcache(case, causal=True)
    check_kvcache(case, True, causal=True)


@pytest.mark.parametrize("window", [(8, -1), (4, 0), (20, 3)])
def test_window(device, window):
    case = KVCase(n_q=3, n_new=3, device=device)
    check_kvcache(case, True, causal=window[1] == 0, window=window)


def test_every_variant(device):
    case = KVCase(h=4, h_kv=2, n_q=5, n_new=2, d=16, dv=8, device=device, dtype=torch.float32)
    slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625]] * 3, device=device) * torch.tensor([[1.0], [0.5], [2.0]],
                                                                                          device=device)
    sinks = torch.tensor([0.3, -1.0, 2.0, 0.0], device=device)
    for paged in (False, True):
        check_kvcache(case, paged, causal=True, window=(30, -1), softcap=3.0, alibi=slopes, sinks=sinks, num_splits=3)


@pytest.mark.parametrize("splits", [1, 2, 5, 0])
def test_split_kv(device, splits):
    """A long cache cut into ranges and merged by lse: every split count gives the oracle's answer; sinks
    enter once (in the merge)."""
    case = KVCase(n_q=2, n_new=2, lens=(300, 7, 509), capacity=512, device=device)
    sinks = torch.tensor([0.5] * 8, device=device)
    check_kvcache(case, causal=True, sinks=sinks, num_splits=splits)


@pytest.mark.parametrize("n_q,h_kv", [(1, 2), (5, 1)])
def test_the_decode_launch_merges_its_splits_with_the_combine_kernels_bits(device, monkeypatch, n_q, h_kv):
    """An eager call's splits (up to MERGE_MAX_SPLITS) are merged by the decode launch itself (its last
    program to finish, rows a step: one step, and several with N_q = 5 x 8 heads), with no combine launch;
    past MERGE_MAX_SPLITS the combine kernel merges them, to the same bits (sinks included), as it does for
    a call through the op. The merge leaves its counters zero: repeated calls give the same bits."""
    from diyflash.kernels.attention import kvcache

    combines = []
    real = kvcache._COMBINE

    class Spy:
        def __call__(self, *args, **meta):
            combines.append(args[0])
            return real(*args, **meta)

        def bind(self, *args):
            return None  # no plan: every call launches through here

        def compile_ahead(self, *args):
            return real.compile_ahead(*args)

        _compiled = real._compiled  # (what clear_caches empties)

    monkeypatch.setattr(kvcache, "_COMBINE", Spy())
    monkeypatch.setattr(kvcache, "MERGE_ELEMENTS", 512)  # 2 rows a merge step at 4 splits, D 64
    case = KVCase(h=8, h_kv=h_kv, n_q=n_q, n_new=0, lens=(300, 7, 509), capacity=512, d=64, dtype=torch.float32,
                  device=device)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0] * 2, device=device)
    diyflash.clear_caches()
    try:
        merged = [check_kvcache(case, causal=True, sinks=sinks, num_splits=4)[:2] for _ in range(3)]
        assert not combines
        counts = [t for key, t in kvcache._KEPT.items() if key[-1] == "counts"]
        assert all(not t.any() for t in counts) and (len(counts) > 0) == ON_GPU
        op = torch.ops.diyflash.attention_with_kvcache(case.q, case.k_cache, case.v_cache, case.seqlens, None, None,
                                                       None, True, None, -1, -1, 0.0, None, sinks, 4, None)
        assert len(combines) == (1 if ON_GPU else 0)  # (the interpreter merges in the decode launch throughout)
        monkeypatch.setattr(kvcache, "MERGE_MAX_SPLITS", 3)
        diyflash.clear_caches()
        combined = check_kvcache(case, causal=True, sinks=sinks, num_splits=4)[:2]
        assert len(combines) == (2 if ON_GPU else 1)
        for other in (*merged[1:], combined, op):
            assert all(torch.equal(a, b) for a, b in zip(merged[0], other))
    finally:
        diyflash.clear_caches()  # (the plans made here merged or not by the patched limit)


def test_page_size_256_and_paged_equals_contiguous_bitwise(device):
    case = KVCase(n_q=3, n_new=3, lens=(200, 0, 509), capacity=512, page_size=256, device=device)
    for splits in (1, 3):
        paged = check_kvcache(case, True, causal=True, num_splits=splits)
        dense = check_kvcache(case, False, causal=True, num_splits=splits)
        assert all(torch.equal(a, b) for a, b in zip(paged, dense))
    case16 = KVCase(n_q=1, n_new=1, lens=(33, 100, 0), page_size=16, device=device)
    for splits in (1, 4):
        assert all(torch.equal(a, b) for a, b in zip(case16.run(True, num_splits=splits)[:2],
                                                      case16.run(False, num_splits=splits)[:2]))


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("n_q,splits", [(1, 1), (1, 4), (3, 0)])
def test_left_padded_cache(device, paged, n_q, splits):
    """cache_leftpad: batch b attends to keys cache_leftpad[b] .. cache_seqlens[b] + N_new - 1, what the
    oracle gets from those keys alone (causal, window and ALiBi distances unchanged); starts inside a 64-key
    step, at 0, and at the last key (with N_q = 3 the first rows see none)."""
    case = KVCase(n_q=n_q, n_new=n_q, lens=(100, 0, 300), capacity=512, leftpad=(37, 0, 299 + n_q), device=device)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625] * 2, device=device)
    check_kvcache(case, paged, causal=True, num_splits=splits)
    check_kvcache(case, paged, causal=True, window=(70, -1), alibi=slopes, sinks=torch.full((8,), 0.5, device=device),
          num_splits=splits)


def test_left_padded_cache_paged_equals_contiguous_and_zero_pad_is_none(device):
    case = KVCase(n_q=2, n_new=2, lens=(100, 5, 300), capacity=512, page_size=64, leftpad=(64, 6, 1), device=device)
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
    case = KVCase(n_q=1, n_new=1, lens=(10, 0, 90), leftpad=(11, 0, 3), device=device)
    for splits in (1, 2):
        out, lse, _, _ = case.run(False, num_splits=splits)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isneginf(lse[0]).all()
        out, lse, _, _ = case.run(False, sinks=torch.full((8,), 0.25, device=device), num_splits=splits)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(lse[0], torch.full_like(lse[0], 0.25))


def test_rows_that_see_no_key(device):
    case = KVCase(n_q=1, n_new=0, lens=(0, 5, 0), device=device)
    out, lse, _, _ = case.run(False, sinks=torch.zeros(8, device=device))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(lse[0], torch.zeros_like(lse[0]))
    out, lse, _, _ = case.run(True)
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()


@pytest.mark.parametrize("page_size", [16, 64])  # 64: a page holds whole steps of the decode kernel (ONE_PAGE)
def test_out_of_range_values_are_clamped_not_read(device, page_size):
    """Unchecked values (as while capturing): a length past the capacity, a negative one, a page entry past
    the pool. The op clamps: no write outside the cache, finite output, untouched pages unchanged."""
    case = KVCase(n_q=1, n_new=2, lens=(127, -5, 10), page_size=page_size, device=device)
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
        diyflash.flash_attention_with_kvcache(case.q, k_pages, v_pages, case.seqlens, case.k, case.v, block_table=bt,
                                              validate="sync")
    pool = k_pages.shape[0]
    with pytest.raises(ValueError, match=rf"block_table\[2, 0\] = 10000 is not a page of the cache \(0..{pool - 1}\)"):
        diyflash.flash_attention_with_kvcache(case.q, k_pages, v_pages, case.seqlens.clamp(0, 100), case.k, case.v,
                                              block_table=bt, cache_leftpad=torch.zeros_like(case.seqlens),
                                              validate="sync")


# ---- the op: opcheck (with the mutation), compile, autocast, errors ----------------------------------


@pytest.mark.parametrize("splits", [1, 3])
def test_raw_dot_past_fp32_range_stays_finite(device, splits):
    """Issue 23, item 9, in the decode kernel: q of 3e19 against new keys of 3e19 (raw q.k 9e38, past
    fp32's range; scaled by 1/8, 1.1e38, inside it) is finite and meets the error rule against plain
    PyTorch that scales q first (exact at head_dim 64), split or not."""
    case = KVCase(d=64, n_q=2, n_new=2, dtype=torch.bfloat16, device=device)
    case.q[:, :, 1, 0] = 3e19
    case.q[:, ::3, 0, 0] = -3e19
    case.k[:, :, 0, 0] = 3e19
    out, lse, _, _ = case.run(False, causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                              num_splits=splits)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    want, want_lse = kvcache_oracle(case, causal=True)
    q = case.q
    case.q = q * 0.125
    plain, _ = kvcache_oracle(case, causal=True, scale=1.0, upcast=False)
    case.q = q
    report = error_report("out", out, want, plain)
    assert report.ok, str(report)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("paged,leftpad", [(False, None), (True, None), (False, (3, 0, 64))])
def test_opcheck(device, paged, leftpad):
    case = KVCase(n_q=2, n_new=2, device=device, dtype=torch.float32, leftpad=leftpad)
    k_cache, v_cache, bt = case.caches(paged)
    args = (case.q, k_cache, v_cache, case.seqlens, case.k, case.v, bt, True, None, 8, -1, 0.0, None,
            torch.zeros(8, device=device), 2, case.leftpad)
    torch.library.opcheck(torch.ops.diyflash.attention_with_kvcache.default, args, test_utils="ALL")


@pytest.mark.parametrize("leftpad", [None, (2, 0, 0)])
def test_compile_decode_loop(device, leftpad):
    """A decode loop under torch.compile(fullgraph=True): the cache writes happen in the compiled graph,
    0 graph breaks, and the steps equal the eager ones (with cache_leftpad too)."""
    torch._dynamo.reset()
    case = KVCase(n_q=1, n_new=1, lens=(5, 9, 0), device=device, leftpad=leftpad)

    def step(q, k_cache, v_cache, seqlens, k, v):
        return diyflash.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k, v, causal=True,
                                                     cache_leftpad=case.leftpad)

    compiled = torch.compile(step, fullgraph=True)
    caches_c, caches_e = case.caches(False)[:2], case.caches(False)[:2]
    seqlens = case.seqlens.clone()
    for i in range(4):
        q, k, v = (seeded_randn(t.shape, t.dtype, device, 100 + i) for t in (case.q, case.k, case.v))
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
    traced = KVCase(n_q=2, n_new=2, device=device, leftpad=(3, 0, 64))
    k_cache, v_cache, table = traced.caches(paged)
    args = (traced.q, k_cache, v_cache, traced.seqlens, traced.k, traced.v, table, traced.leftpad)
    ep = torch.export.export(_DecodeStep(), args)
    assert "torch.ops.diyflash.attention_with_kvcache.default" in str(ep.graph)
    functional = ep.run_decompositions()
    assert "diyflash.attention_with_kvcache" in str(functional.graph)
    assert set(functional.graph_signature.user_inputs_to_mutate.values()) == {"k_cache", "v_cache"}
    other = KVCase(n_q=2, n_new=2, lens=(30, 7, 90), device=device, seed=20, leftpad=(0, 2, 5))
    want_caches = other.caches(paged)
    want = _DecodeStep()(other.q, *want_caches[:2], other.seqlens, other.k, other.v, want_caches[2], other.leftpad)
    for program in (ep, functional):
        caches = other.caches(paged)
        got = program.module()(other.q, *caches[:2], other.seqlens, other.k, other.v, caches[2], other.leftpad)
        assert torch.equal(got, want)
        assert torch.equal(caches[0], want_caches[0]) and torch.equal(caches[1], want_caches[1])


def test_autocast(device):
    dtype = torch.bfloat16
    case = KVCase(n_q=2, n_new=2, device=device, dtype=dtype)
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
    case = KVCase(device=device)
    kw, exc, phrase = _errors(case, device)[i]
    a = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, cache_seqlens=case.seqlens, k=case.k, v=case.v,
             block_table=None, num_splits=0, cache_leftpad=None)
    a.update(kw)
    with pytest.raises(exc) as api:
        diyflash.flash_attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["k"], a["v"],
                                              block_table=a["block_table"], num_splits=a["num_splits"],
                                              cache_leftpad=a["cache_leftpad"], validate="sync")
    assert phrase in str(api.value)
    if i in VALUE_ERRORS:
        return  # values: the API checks them (validate); the op never reads them on the host (the kernels clamp)
    args = (a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["k"], a["v"], a["block_table"], False, None,
            -1, -1, 0.0, None, None, a["num_splits"], a["cache_leftpad"])
    with pytest.raises(exc) as op:
        torch.ops.diyflash.attention_with_kvcache(*args)
    assert phrase in str(op.value) and "diyflash::attention_with_kvcache" in str(op.value)


def test_pytorch_path_matches_the_kernels(torch_path):
    case = KVCase(n_q=3, n_new=3, dtype=torch.float64)
    for paged in (False, True):
        check_kvcache(case, paged, causal=True, window=(40, -1), sinks=torch.zeros(8, dtype=torch.float64))
    case.leftpad = torch.tensor([4, 0, 33], dtype=torch.int32)
    check_kvcache(case, True, causal=True, window=(40, -1), sinks=torch.zeros(8, dtype=torch.float64))


# ---- GPU only: a 64k cache, a captured decode loop -----------------------------------------------------


@pytest.mark.skipif(not ON_GPU, reason="a 64k-token cache: the interpreter would take minutes")
def test_long_cache_gpu(device):
    case = KVCase(b=2, h=32, h_kv=8, n_q=1, n_new=1, d=128, lens=(65535, 40000), capacity=65536, page_size=256,
                dtype=torch.bfloat16, device=device)
    for paged in (False, True):
        check_kvcache(case, paged, causal=True)
