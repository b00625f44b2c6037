"""The argument rules (diyflash.ops.rules) and the second adversarial review's cases (issue 44): strided
index tensors, overlapping caches, non-finite sinks and softcaps, the API's cache version counters, the
SDPA drop-in's flags and the transformers backend's packed rows. Each case failed before its fix; the
randomized differential test (test_differential.py) covers the neighbours."""

import threading

import pytest
import torch

import diyflash
from diyflash.ops import rules
from diyflash.reference import attention_ref
from helpers import ON_GPU


def _randn(shape, dtype, device, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _column(values, device):
    """values as a non-contiguous column: column 0 of a (len, 2) int32 table."""
    table = torch.stack([torch.tensor(values, dtype=torch.int32), torch.full((len(values),), 99, dtype=torch.int32)], 1)
    col = table.to(device)[:, 0]
    assert not col.is_contiguous()
    return col


# -- the rule table covers every tensor argument of every op ------------------------------------------


def test_every_tensor_argument_of_every_op_has_a_rule():
    """A new tensor argument of any diyflash op cannot skip the rules: its name must be in the table."""
    from diyflash.ops.registry import registry

    missing = []
    for entry in registry().values():
        schema = torch._C.parse_schema(f"{entry.qualname}{entry.signature}")
        for arg in schema.arguments:
            if "Tensor" in str(arg.type) and arg.name not in rules.RULES:
                missing.append(f"{entry.qualname}.{arg.name}")
    assert not missing, missing


def test_rule_kinds():
    assert rules.RULES["cu_seqlens_q"].kind == "index" and rules.RULES["block_table"].kind == "index"
    assert rules.RULES["alibi_slopes"].kind == "param" and rules.RULES["sinks"].kind == "param"
    assert rules.RULES["k_cache"].kind == "written"


# -- 1. strided cu_seqlens ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", [True, False])
def test_varlen_strided_cu_seqlens(device, api):
    lens_q, lens_k = [3, 0, 5], [4, 2, 6]
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 12], dtype=torch.int32)
    q = _randn((8, 4, 16), torch.float16, device, 0)
    k = _randn((12, 2, 16), torch.float16, device, 1)
    v = _randn((12, 2, 16), torch.float16, device, 2)
    sq, sk = _column(cu_q.tolist(), device), _column(cu_k.tolist(), device)
    if api:
        out = diyflash.flash_attention_varlen(q, k, v, sq, sk, max(lens_q), max(lens_k), causal=True)
    else:
        out = torch.ops.diyflash.attention_varlen(q, k, v, sq, sk, max(lens_q), max(lens_k), True)
    want = diyflash.flash_attention_varlen(q, k, v, cu_q.to(device), cu_k.to(device), 5, 6, causal=True)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_varlen_strided_cu_seqlens_backward(device):
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    q, k, v = (_randn((9, 2, 16), torch.float32, device, s).requires_grad_() for s in range(3))
    col = _column(cu.tolist(), device)
    out = diyflash.flash_attention_varlen(q, k, v, col, col, 6, 6, causal=True)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    out2 = diyflash.flash_attention_varlen(q, k, v, cu.to(device), cu.to(device), 6, 6, causal=True)
    want = torch.autograd.grad(out2.sum(), (q, k, v))
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


# -- 2. strided block_table: reads and the append ----------------------------------------------------


@pytest.mark.parametrize("through_op", [False, True])
def test_kvcache_strided_block_table(device, through_op):
    b, h_kv, page, d = 2, 1, 16, 16
    k_pages = _randn((6, h_kv, page, d), torch.float16, device, 0)
    v_pages = _randn((6, h_kv, page, d), torch.float16, device, 1)
    table = torch.tensor([[4, 1, 3], [0, 5, 2]], dtype=torch.int32)
    strided = table.t().contiguous().to(device).t()  # the same values, column-major
    assert not strided.is_contiguous()
    q = _randn((b, 2, 1, d), torch.float16, device, 2)
    k_new = _randn((b, h_kv, 1, d), torch.float16, device, 3)
    v_new = _randn((b, h_kv, 1, d), torch.float16, device, 4)
    seqlens = torch.tensor([17, 20], dtype=torch.int32, device=device)
    results = []
    for bt in (table.to(device), strided):
        kc, vc = k_pages.clone(), v_pages.clone()
        if through_op:
            out = torch.ops.diyflash.attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new, bt)[0]
        else:
            out = diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new, block_table=bt)
        results.append((out, kc, vc))
    (o1, k1, v1), (o2, k2, v2) = results
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    assert torch.equal(k2, k1) and torch.equal(v2, v1)  # no page of another sequence written


def test_kvcache_strided_seqlens_and_leftpad(device):
    b, d = 3, 16
    q = _randn((b, 2, 1, d), torch.float16, device, 0)
    kc = _randn((b, 1, 32, d), torch.float16, device, 1)
    vc = _randn((b, 1, 32, d), torch.float16, device, 2)
    lens, pads = [5, 20, 9], [1, 0, 4]
    want = diyflash.flash_attention_with_kvcache(q, kc, vc, torch.tensor(lens, dtype=torch.int32, device=device),
                                                 cache_leftpad=torch.tensor(pads, dtype=torch.int32, device=device))
    got = diyflash.flash_attention_with_kvcache(q, kc, vc, _column(lens, device), cache_leftpad=_column(pads, device))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dense_strided_seq_lens(device):
    q, k, v = (_randn((3, 2, 20, 16), torch.float16, device, s) for s in range(3))
    lens = [20, 7, 13]
    want = diyflash.flash_attention(q, k, v, True, seq_lens=torch.tensor(lens, dtype=torch.int32, device=device))
    torch.testing.assert_close(diyflash.flash_attention(q, k, v, True, seq_lens=_column(lens, device)), want,
                               rtol=0, atol=0)


# -- 3. strided alibi_slopes: every route of the backward prepares them -------------------------------


def _grads(fn, q, k, v):
    out = fn(q, k, v)
    return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


@pytest.mark.parametrize("route", ["api", "op", "autocast"])
def test_strided_alibi_slopes_backward(device, route):
    h = 4
    q, k, v = (_randn((1, h, 12, 16), torch.float32, device, s).requires_grad_() for s in range(3))
    wide = torch.tensor([0.5, 9.0, 0.25, 9.0, 0.125, 9.0, 0.0625, 9.0], device=device)
    strided = wide[::2]
    packed = strided.contiguous()

    def call(slopes):
        if route == "op":
            return lambda q, k, v: torch.ops.diyflash.attention(q, k, v, True, alibi_slopes=slopes)
        if route == "autocast":
            def run(q, k, v):
                with torch.autocast(device.type, dtype=torch.bfloat16 if device.type == "cpu" else torch.float16):
                    return diyflash.flash_attention(q, k, v, True, alibi_slopes=slopes).float()
            return run
        return lambda q, k, v: diyflash.flash_attention(q, k, v, True, alibi_slopes=slopes)

    for g, w in zip(_grads(call(strided), q, k, v), _grads(call(packed), q, k, v)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_strided_alibi_slopes_varlen_backward(device):
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    q, k, v = (_randn((12, 4, 16), torch.float32, device, s).requires_grad_() for s in range(3))
    table = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [0.3, 0.2, 0.1, 0.05]], device=device)
    strided = table.t().contiguous().t()  # (B, H) with a unit batch stride: not unit along the heads
    assert strided.stride(-1) != 1

    def fn(slopes):
        return lambda q, k, v: diyflash.flash_attention_varlen(q, k, v, cu, cu, 7, 7, True, alibi_slopes=slopes)

    for g, w in zip(_grads(fn(strided), q, k, v), _grads(fn(table), q, k, v)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


# -- 4. overlapping caches are refused where they are written -----------------------------------------


def _kv_case(device, b=2, cap=32, d=16):
    q = _randn((b, 2, 1, d), torch.float16, device, 0)
    k_new = _randn((b, 1, 1, d), torch.float16, device, 3)
    v_new = _randn((b, 1, 1, d), torch.float16, device, 4)
    seqlens = torch.tensor([3, 5][:b], dtype=torch.int32, device=device)
    return q, k_new, v_new, seqlens


@pytest.mark.parametrize("through_op", [False, True])
def test_expanded_cache_refused_when_written(device, through_op):
    q, k_new, v_new, seqlens = _kv_case(device)
    kc = _randn((1, 1, 32, 16), torch.float16, device, 1).expand(2, -1, -1, -1)  # one prompt shared by the rows
    vc = _randn((2, 1, 32, 16), torch.float16, device, 2)
    with pytest.raises(ValueError, match="k_cache.*overlap"):
        if through_op:
            torch.ops.diyflash.attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new)
        else:
            diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new)
    # reading a shared prompt without writing is fine
    out = diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens)
    assert out.shape == q.shape


@pytest.mark.parametrize("through_op", [False, True])
def test_same_cache_for_k_and_v_refused_when_written(device, through_op):
    q, k_new, v_new, seqlens = _kv_case(device)
    buf = _randn((2, 1, 40, 24), torch.float16, device, 1)
    kc = buf[:, :, :32, :16]
    for vc in (kc, buf[:, :, 8:40, :16], buf[:, :, :32, 8:24], buf[:, :, :32, 8:16]):
        with pytest.raises(ValueError, match="overlap"):
            vn = v_new[..., :vc.shape[-1]]
            if through_op:
                torch.ops.diyflash.attention_with_kvcache(q, kc, vc, seqlens, k_new, vn)
            else:
                diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, k_new, vn)


def test_new_keys_overlapping_the_cache_refused(device):
    q, _, _, seqlens = _kv_case(device)
    kc = _randn((2, 1, 32, 16), torch.float16, device, 1)
    vc = _randn((2, 1, 32, 16), torch.float16, device, 2)
    with pytest.raises(ValueError, match="overlap"):
        diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, kc[:, :, :1], vc[:, :, 1:2])


def test_paged_pool_overlap_refused(device):
    q, k_new, v_new, seqlens = _kv_case(device)
    pages = _randn((4, 1, 16, 16), torch.float16, device, 1)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="overlap"):
        diyflash.flash_attention_with_kvcache(q, pages, pages, seqlens, k_new, v_new, block_table=bt)
    expanded = pages[:1].expand(4, -1, -1, -1)
    with pytest.raises(ValueError, match="overlap"):
        diyflash.flash_attention_with_kvcache(q, expanded, pages.clone(), seqlens, k_new, v_new, block_table=bt)


@pytest.mark.parametrize("layout", ["halves", "interleaved", "interleaved_mla"])
def test_disjoint_views_of_one_buffer_accepted(device, layout):
    """k_cache and v_cache in one buffer without sharing an element: its two halves (2, B, ...), K and V
    interleaved (B, N, 2, H, D) as flash-attn's packed kv, or side by side in each row (D 16, D_v 8):
    accepted, and equal to separate caches."""
    q, k_new, v_new, seqlens = _kv_case(device)
    if layout == "halves":
        both = _randn((2, 2, 1, 32, 16), torch.float16, device, 1)
        kc, vc = both[0], both[1]
    elif layout == "interleaved":
        both = _randn((2, 32, 2, 1, 16), torch.float16, device, 1)
        kc, vc = both[:, :, 0].transpose(1, 2), both[:, :, 1].transpose(1, 2)
    else:
        both = _randn((2, 1, 32, 24), torch.float16, device, 1)
        kc, vc = both[..., :16], both[..., 16:]
        v_new = v_new[..., :8]
    ref_k, ref_v = kc.clone(), vc.clone()
    out = diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new)
    want = diyflash.flash_attention_with_kvcache(q, ref_k, ref_v, seqlens, k_new, v_new)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)


# -- 6. a sink of +inf (or beyond fp32's base-2 range) holds all of its row's mass, on every route -------


def _sink_routes(device, sinks):
    """(name, out, lse) of one call with these sinks through each route that computes them."""
    h, d = sinks.shape[0], 16
    q = _randn((2, h, 5, d), torch.float32, device, 0)
    k = _randn((2, h, 9, d), torch.float32, device, 1)
    v = _randn((2, h, 9, d), torch.float32, device, 2)
    outs = []
    out, lse = diyflash.flash_attention(q, k, v, True, sinks=sinks, return_lse=True)
    outs.append(("dense", out, lse))
    qv, kv, vv = (t.transpose(1, 2).reshape(-1, h, d) for t in (q, k, v))
    cu_q = torch.tensor([0, 5, 10], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 9, 18], dtype=torch.int32, device=device)
    out, lse = diyflash.flash_attention_varlen(qv, kv, vv, cu_q, cu_k, 5, 9, True, sinks=sinks, return_lse=True)
    outs.append(("varlen", out.view(2, 5, h, d).transpose(1, 2), lse.view(h, 2, 5).transpose(0, 1)))
    lens = torch.tensor([9, 9], dtype=torch.int32, device=device)
    for splits in (1, 3):
        out, lse = diyflash.flash_attention_with_kvcache(q[:, :, -1:], k, v, lens, sinks=sinks, return_lse=True,
                                                         num_splits=splits)
        outs.append((f"decode{splits}", out, lse))
    out, lse = torch.ops.diyflash.attention_fwd(q.double(), k.double(), v.double(), True, None, None,
                                                sinks=sinks.double())  # the PyTorch path
    outs.append(("torch", out, lse))
    ref_out, ref_lse = attention_ref(q, k, v, True, sinks=sinks)
    outs.append(("reference", ref_out, ref_lse))
    return outs


@pytest.mark.parametrize("sink", [float("inf"), 3e38])
def test_huge_sink_holds_the_mass_on_every_route(device, sink):
    sinks = torch.tensor([0.5, sink], device=device)
    for name, out, lse in _sink_routes(device, sinks):
        assert not out.isnan().any() and not lse.isnan().any(), name
        assert (out[:, 1] == 0).all(), name
        assert (lse[:, 1].double() == float(sinks[1])).all(), (name, lse[:, 1])
        assert out[:, 0].abs().sum() > 0, name


def test_huge_sink_gradient_is_finite(device):
    h = 2
    q, k, v = (_randn((1, h, 6, 16), torch.float32, device, s).requires_grad_() for s in range(3))
    sinks = torch.tensor([0.3, float("inf")], device=device, requires_grad=True)
    out = diyflash.flash_attention(q, k, v, True, sinks=sinks)
    grads = torch.autograd.grad(out, (q, k, v, sinks), torch.ones_like(out))
    for g in grads:
        assert not g.isnan().any()
    assert (grads[0][:, 1] == 0).all() and grads[3][1] == 0


# -- 7. softcap: finite in fp32, with its base-2 form finite too ---------------------------------------


@pytest.mark.parametrize("softcap", [1e39, 3e38, 2.4e38, float("nan")])
def test_softcap_beyond_fp32_refused(device, softcap):
    q, k, v = (_randn((1, 2, 4, 16), torch.float16, device, s) for s in range(3))
    with pytest.raises(ValueError, match="softcap"):
        diyflash.flash_attention(q, k, v, softcap=softcap)
    with pytest.raises(ValueError, match="softcap"):
        torch.ops.diyflash.attention(q, k, v, softcap=softcap)


def test_largest_softcap_accepted(device):
    q, k, v = (_randn((1, 2, 4, 16), torch.float32, device, s) for s in range(3))
    out = diyflash.flash_attention(q, k, v, softcap=rules.MAX_SOFTCAP)
    torch.testing.assert_close(out, diyflash.flash_attention(q, k, v), rtol=1e-5, atol=1e-5)


# -- 8. the API's append bumps the caches' version counters -------------------------------------------


def test_api_append_bumps_cache_versions(device):
    q, k_new, v_new, seqlens = _kv_case(device)
    kc = _randn((2, 1, 32, 16), torch.float16, device, 1)
    vc = _randn((2, 1, 32, 16), torch.float16, device, 2)
    before = kc._version, vc._version
    diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new)
    assert kc._version > before[0] and vc._version > before[1]
    before = kc._version, vc._version
    diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens)  # no append: nothing written
    assert (kc._version, vc._version) == before


def test_saved_cache_then_appended_raises_in_backward(device):
    q, k_new, v_new, seqlens = _kv_case(device)
    w = torch.ones(16, device=device, dtype=torch.float16, requires_grad=True)
    kc = _randn((2, 1, 32, 16), torch.float16, device, 1)
    vc = _randn((2, 1, 32, 16), torch.float16, device, 2)
    loss = (kc * w).sum()  # autograd saves kc
    diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_inference_mode_caches_append(device):
    q, k_new, v_new, seqlens = _kv_case(device)
    with torch.inference_mode():
        kc = _randn((2, 1, 32, 16), torch.float16, device, 1)
        vc = _randn((2, 1, 32, 16), torch.float16, device, 2)
        diyflash.flash_attention_with_kvcache(q, kc, vc, seqlens, k_new, v_new)
    assert torch.equal(kc[0, :, 3], k_new[0, :, 0])


# -- 10. the SDPA drop-in's flags ---------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
def test_sdpa_flags_must_be_bools(device, flag):
    q, k, v = (_randn((1, 2, 4, 16), torch.float16, device, s) for s in range(3))
    with pytest.raises(TypeError, match=flag):
        diyflash.scaled_dot_product_attention(q, k, v, **{flag: "no"})
    with pytest.raises(TypeError):  # what SDPA itself says
        torch.nn.functional.scaled_dot_product_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(),
                                                         **{flag: "no"})


# -- 13. the kept decode buffers under several threads and streams at once (GPU) ----------------------


@pytest.mark.skipif(not ON_GPU, reason="streams and kept buffers are CUDA's")
def test_kept_buffers_threads_and_streams_at_once(device):
    b, h, h_kv, d = 2, 8, 2, 64
    cases = []
    for i in range(6):
        q = _randn((b, h, 1, d), torch.float16, device, 10 * i)
        kc = _randn((b, h_kv, 4096, d), torch.float16, device, 10 * i + 1)
        vc = _randn((b, h_kv, 4096, d), torch.float16, device, 10 * i + 2)
        lens = torch.tensor([4000 - i, 1000 + i], dtype=torch.int32, device=device)
        cases.append((q, kc, vc, lens))
    want = [diyflash.flash_attention_with_kvcache(*c, num_splits=8) for c in cases]
    torch.cuda.synchronize()
    got = [None] * len(cases)
    errors = []

    def worker(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(20):
                    got[i] = diyflash.flash_attention_with_kvcache(*cases[i], num_splits=8)
            stream.synchronize()
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.skipif(not ON_GPU, reason="CUDA caps grid dims y and z at 65535; the interpreter has no such cap")
@pytest.mark.parametrize("splits", [1, 2])
def test_kvcache_batch_beyond_the_grid_cap(device, splits):
    b, d = 65537, 16
    q = _randn((b, 1, 1, d), torch.float16, device, 0)
    kc = _randn((b, 1, 32, d), torch.float16, device, 1)
    vc = _randn((b, 1, 32, d), torch.float16, device, 2)
    k_new = _randn((b, 1, 1, d), torch.float16, device, 3)
    v_new = _randn((b, 1, 1, d), torch.float16, device, 4)
    lens = (torch.arange(b, device=device) % 31).to(torch.int32)
    ref_k, ref_v = kc.clone(), vc.clone()
    idx = torch.arange(b, device=device)
    ref_k[idx, 0, lens.long()] = k_new[:, 0, 0]
    ref_v[idx, 0, lens.long()] = v_new[:, 0, 0]
    out = diyflash.flash_attention_with_kvcache(q, kc, vc, lens, k_new, v_new, num_splits=splits)
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)
    for i in (0, 1, 65535, 65536):
        n = int(lens[i]) + 1
        want, _ = attention_ref(q[i:i + 1], ref_k[i:i + 1, :, :n], ref_v[i:i + 1, :, :n])
        assert (out[i:i + 1].double() - want).abs().max() < 2e-3, i


def test_empty_out_of_an_expanded_q_is_dense(device):
    """The output of a q expanded over its batch, with D_v != D, is contiguous (as empty_like makes it):
    its dims ordered by stride had put the batch innermost, and the H200 forward faulted on that layout
    (found by test_differential.py: B2 causal N_q 1023 N_k 1 D128 D_v 16 bf16)."""
    q = _randn((1, 2, 9, 32), torch.float16, device, 0).expand(3, -1, -1, -1)
    k = _randn((3, 2, 4, 32), torch.float16, device, 1)
    v = _randn((3, 2, 4, 16), torch.float16, device, 2)
    out = diyflash.flash_attention(q, k, v, True)
    assert out.is_contiguous()
    torch.testing.assert_close(out, diyflash.flash_attention(q.contiguous(), k, v, True), rtol=0, atol=0)
