"""The attention variants (issue 24): GQA/MQA, sliding windows, softcap, ALiBi, sinks, D_v != D_qk and
the lse, alone and combined, against the dense float64 oracle (diyflash.reference.attention_ref) with
the 2x-plain-PyTorch rule, on out, lse, dq, dk, dv and dsinks. The same file runs on CPU (Triton's
interpreter, 32x32 tiles, so lengths past 64 cover skipped, masked and unmasked key blocks) and on CUDA.
"""


import pytest
import torch

import diyflash
from diyflash.reference import attention_ref
from diyflash.utils.validation import compare_with_oracle
from helpers import ON_GPU, copies_of, opcheck_backward, sink_logits, slopes

_GEN_SEED = 0


def _randn(shape, dtype, device, layout="bhnd", seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if layout == "bnhd" and len(shape) == 4:
        b, h, n, d = shape
        return torch.randn(b, n, h, d, generator=gen).to(device=device, dtype=dtype).transpose(1, 2)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def make(b, h, h_kv, n_q, n_k, d, dv=None, dtype=torch.float16, device="cpu", layout="bhnd"):
    dv = d if dv is None else dv
    q = _randn((b, h, n_q, d), dtype, device, layout, 1)
    k = _randn((b, h_kv, n_k, d), dtype, device, layout, 2)
    v = _randn((b, h_kv, n_k, dv), dtype, device, layout, 3)
    return q, k, v


def check(q, k, v, causal=False, scale=None, seq_lens=None, window=(-1, -1), softcap=0.0, alibi=None,
          sinks=None, what=("out", "lse"), deterministic=None):
    """diyflash.flash_attention against attention_ref: out with dq, dk, dv (and dsinks), then lse with a
    loss on lse alone (its gradients through dlse), each under the 2x rule. deterministic: flash_attention's."""
    kw = dict(window_size=window, softcap=softcap, alibi_slopes=alibi)
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    names = ("dq", "dk", "dv", "dsinks")[:len(inputs)]

    def ours(q, k, v, s=None):
        return diyflash.flash_attention(q, k, v, causal, scale, seq_lens, sinks=s, return_lse=True,
                                        deterministic=deterministic, **kw)

    def ref(q, k, v, s=None, upcast=True):
        return attention_ref(q, k, v, causal, scale, seq_lens, upcast, sinks=s, **kw)

    results = {}
    got, grads, reports = compare_with_oracle(lambda *t: ours(*t)[0], lambda *t, upcast: ref(*t, upcast=upcast)[0],
                                              inputs, "out", names)
    results["out"] = (got, grads)
    if "lse" in what:  # a loss on lse alone: its gradients reach q, k (and sinks) through dlse, not v
        lse_inputs = (q, k) if sinks is None else (q, k, sinks)
        v_of = lambda t: v if t.dtype == v.dtype else v.to(t.dtype)  # noqa: E731
        got_lse, _, lse_reports = compare_with_oracle(
            lambda q, k, *s: _finite(ours(q, k, v_of(q), *s)[1]),
            lambda q, k, *s, upcast: _finite(ref(q, k, v_of(q), *s, upcast=upcast)[1]),
            lse_inputs, "lse", tuple(f"{n} (via lse)" for n in ("dq", "dk", "dsinks")[:len(lse_inputs)]),
            dout=_lse_grad(q, seq_lens))
        reports += lse_reports
        lse = ours(q, k, v)[1] if sinks is None else ours(q, k, v, sinks)[1]
        want = ref(q.double(), k.double(), v.double(), None if sinks is None else sinks.double())[1]
        assert torch.equal(torch.isneginf(lse), torch.isneginf(want)), "rows with lse = -inf differ"
        results["lse"] = (lse.detach(), None)
    for report in reports:
        assert report.ok, str(report)
    out, grads = results["out"]
    assert out.shape == (*q.shape[:-1], v.shape[-1]) and out.dtype == q.dtype
    for g, t in zip(grads, inputs):
        assert g.shape == t.shape and g.dtype == t.dtype
    return results


def _finite(lse):
    # rows that see no key have lse = -inf on both sides (checked apart); compare the others
    return torch.where(torch.isneginf(lse), 0.0, lse)


def _lse_grad(q, seq_lens):
    gen = torch.Generator(device="cpu").manual_seed(5)
    return torch.randn(q.shape[:-1], generator=gen).to(q.device)


@pytest.mark.parametrize("h,h_kv", [(8, 2), (4, 1), (8, 1), (3, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(17, 17), (113, 47), (33, 113)])
def test_gqa(device, h, h_kv, causal, n_q, n_k):
    q, k, v = make(2, h, h_kv, n_q, n_k, 16, device=device)
    check(q, k, v, causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gqa_dtypes(device, dtype):
    q, k, v = make(1, 4, 2, 70, 70, 32, dtype=dtype, device=device)
    check(q, k, v, True)


@pytest.mark.parametrize("window,causal", [((8, -1), True), ((4, 4), False), ((0, 0), False), ((-1, 3), False),
                                           ((20, 0), False), ((0, -1), True), ((40, 7), True)])
@pytest.mark.parametrize("n_q,n_k", [(113, 113), (40, 113), (113, 40), (1, 1023)])
def test_window(device, window, causal, n_q, n_k):
    q, k, v = make(1, 2, 2, n_q, n_k, 16, device=device)
    check(q, k, v, causal, window=window)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_window_d128(device, dtype):
    """D128 causal windows take their own forward tiles on the GPU (attention_configs.WINDOW_FWD)."""
    q, k, v = make(1, 2, 1, 300 if ON_GPU else 113, 300 if ON_GPU else 113, 128, dtype=dtype, device=device)
    check(q, k, v, True, window=(70, -1))


def test_window_skips_blocks_outside_the_band(device, monkeypatch):
    """A key far outside every query's band is never read: poisoning it (NaN) changes nothing."""
    q, k, v = make(1, 2, 2, 256, 256, 16, device=device)
    clean = diyflash.flash_attention(q, k, v, True, window_size=(16, -1))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :64], v2[:, :, :64] = float("nan"), float("nan")  # rows >= 160 never see keys < 144
    poisoned = diyflash.flash_attention(q, k2, v2, True, window_size=(16, -1))
    assert torch.equal(clean[:, :, 160:], poisoned[:, :, 160:])


@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(device, softcap, causal):
    q, k, v = make(1, 2, 2, 70, 90, 32, device=device)
    check(q * 3, k, v, causal, softcap=softcap)


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi(device, per_batch, causal):
    q, k, v = make(2, 4, 4, 50, 70, 16, device=device)
    check(q, k, v, causal, alibi=slopes(4, 2 if per_batch else None, device))


@pytest.mark.parametrize("causal,window,n_q,n_k", [(False, (-1, -1), 40, 70), (True, (-1, -1), 70, 40),
                                                   (True, (3, -1), 70, 70), (False, (0, 0), 33, 33)])
def test_sinks(device, causal, window, n_q, n_k):
    """(True, 70x40): the first 30 rows see no key; with a sink they output 0 and their lse is the sink."""
    q, k, v = make(1, 4, 2, n_q, n_k, 16, device=device)
    sinks = sink_logits(4, device)
    results = check(q, k, v, causal, window=window, sinks=sinks)
    if causal and n_q > n_k and window == (-1, -1):
        out, lse = results["out"][0], results["lse"][0]
        blind = n_q - n_k
        assert torch.equal(out[:, :, :blind], torch.zeros_like(out[:, :, :blind]))
        torch.testing.assert_close(lse[:, :, :blind], sinks.view(1, -1, 1).expand_as(lse[:, :, :blind]))


@pytest.mark.parametrize("d,dv", [(32, 16), (16, 40), (24, 8)] + ([(192, 128)] if ON_GPU else []))
@pytest.mark.parametrize("causal", [False, True])
def test_dv_differs(device, d, dv, causal):
    q, k, v = make(1, 2, 1, 50, 66, d, dv, device=device)
    check(q, k, v, causal)


@pytest.mark.parametrize("d,dv", [(128, 16), (64, 32), (256, 32)])
def test_narrow_v_beside_one_key(device, d, dv):
    """A 16/32-wide v beside wide q/k tiles, causal, one key, bf16 (two passes): Triton 3.6 compiled the forward
    for it into a kernel reading shared memory out of bounds (illegal address on some calls); the v tile is
    widened to min(padded D, 64) (launch_args.v_pad). Found by test_differential on the H200."""
    from diyflash.kernels.attention.launch_args import v_pad

    assert v_pad(d, dv) == 64 and v_pad(32, 16) == 32 and v_pad(24, 8) == 32 and v_pad(16, 8) == 16
    q, k, v = make(2, 1, 1, 1023 if ON_GPU else 77, 1, d, dv, dtype=torch.bfloat16 if ON_GPU else torch.float16,
                   device=device)
    for _ in range(3 if ON_GPU else 1):
        check(q, k, v, True, alibi=slopes(1, None, device))
    check(q, k, v, False)


def test_dv_differs_keeps_layout(device):
    q, k, v = make(2, 4, 2, 33, 33, 32, 16, device=device, layout="bnhd")
    out = diyflash.flash_attention(q, k, v)
    assert out.shape == (2, 4, 33, 16)
    assert out.transpose(1, 2).is_contiguous()  # q's (B, N, H, D) storage order


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else []))
def test_everything_at_once(device, layout, dtype):
    q, k, v = make(2, 8, 2, 90, 100, 32, 24, dtype=dtype, device=device, layout=layout)
    seq_lens = torch.tensor([100, 61], dtype=torch.int32, device=device)
    check(q, k, v, True, 0.2, seq_lens, window=(30, -1), softcap=4.0, alibi=slopes(8, 2, device),
          sinks=sink_logits(8, device))


def test_lse_is_a_loss(device):
    """A loss on lse alone gets gradients (dlse flows into dq and dk; dv is exactly 0)."""
    q, k, v = make(1, 4, 2, 40, 50, 16, device=device)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    _, lse = diyflash.flash_attention(q, k, v, True, return_lse=True, window_size=(9, -1))
    lse.exp().sum().backward()
    assert q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0
    assert torch.equal(v.grad, torch.zeros_like(v))


_FEW_ROWS = [  # (h, h_kv, n_q, n_k, d, dv, layout, variants): N_q x group <= 64, the decode kernel's tile
    (8, 2, 1, 113, 64, None, "bhnd", dict(causal=True)),  # a decode step, GQA 4
    (8, 1, 8, 1023 if ON_GPU else 300, 80, None, "bnhd", dict(causal=True, window=(64, 0), softcap=20.0)),  # 8 x 8
    (4, 4, 16, 17, 32, 16, "bhnd", dict(alibi=True, sinks=True)),  # group 1, D_v != D
    (8, 2, 3, 1, 64, None, "bhnd", dict(causal=False)),  # fewer keys than rows
]


@pytest.mark.parametrize("case", range(len(_FEW_ROWS)))
def test_few_query_rows_run_the_decode_kernel(device, monkeypatch, case):
    """flash_attention with N_q x (H / H_kv) <= 64 rows runs the decode kernel (split-KV, the q heads of a
    kv head in one tile; launch.decode_route): out, lse and the gradients through the dense backward under
    the 2x rule. One more row (N_q 17, group 4) stays on the forward kernel."""
    from diyflash.kernels.attention import kvcache

    calls = []
    real = kvcache.attention_kvcache
    monkeypatch.setattr(kvcache, "attention_kvcache", lambda *a, **kw: (calls.append(a[3]), real(*a, **kw))[1])
    h, h_kv, n_q, n_k, d, dv, layout, var = _FEW_ROWS[case]
    q, k, v = make(2, h, h_kv, n_q, n_k, d, dv, device=device, layout=layout)
    sinks = sink_logits(h, device) if var.get("sinks") else None
    alibi = slopes(h, device=device) if var.get("alibi") else None
    check(q, k, v, var.get("causal", False), window=var.get("window", (-1, -1)), softcap=var.get("softcap", 0.0),
          alibi=alibi, sinks=sinks)
    assert calls and all(lengths is None for lengths in calls)  # the dense call: every key, no cache lengths
    calls.clear()
    diyflash.flash_attention(*make(1, 8, 2, 17, 40, 64, device=device), causal=True)
    assert not calls


@pytest.mark.parametrize("n_q,n_k", [(0, 9), (9, 0), (0, 0)])
def test_empty_lengths_with_variants(device, n_q, n_k):
    """Length 0 on either side: no NaN; with no key at all every row outputs 0 and its lse is the sink."""
    q, k, v = (t.requires_grad_() for t in make(1, 4, 2, n_q, n_k, 16, 8, device=device))
    sinks = sink_logits(4, device).requires_grad_()
    out, lse = diyflash.flash_attention(q, k, v, True, window_size=(3, -1), sinks=sinks, return_lse=True)
    assert out.shape == (1, 4, n_q, 8) and lse.shape == (1, 4, n_q)
    assert torch.equal(out, torch.zeros_like(out))
    torch.testing.assert_close(lse, sinks.detach().view(1, 4, 1).expand_as(lse))  # via log2: within an ulp
    (out.float().sum() + lse.sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, sinks))
    torch.testing.assert_close(sinks.grad, torch.full_like(sinks, float(n_q)))  # d lse / d sink = 1 per row


def test_lse_of_rows_that_see_nothing(device):
    q, k, v = make(1, 2, 2, 20, 10, 16, device=device)
    out, lse = diyflash.flash_attention(q, k, v, True, return_lse=True)
    assert torch.isneginf(lse[:, :, :10]).all() and torch.isfinite(lse[:, :, 10:]).all()
    assert torch.equal(out[:, :, :10], torch.zeros_like(out[:, :, :10]))


def test_gqa_gradients_are_deterministic_and_not_copied(device):
    q, k, v = make(2, 8, 2, 100, 100, 32, device=device, layout="bnhd")
    sinks = sink_logits(8, device)
    dout = _randn(q.shape, q.dtype, device, seed=9)

    def grads():
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
        out = diyflash.flash_attention(*leaves[:3], True, window_size=(40, -1), sinks=leaves[3], deterministic=True)
        return torch.autograd.grad(out, leaves, dout)

    first = grads()
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    assert first[1].shape == k.shape and first[2].shape == v.shape
    assert not copies_of(grads, k, v)  # k and v are never repeated across the group


@pytest.mark.parametrize("case", [
    # (b, h, h_kv, n_q, n_k, d, dv, causal, window, softcap, alibi, sinks, seq_lens)
    (2, 8, 2, 113, 47, 80, 80, True, (-1, -1), 0.0, False, True, None),  # GQA 4, sinks, tails, N_q != N_k
    (1, 4, 1, 70, 113, 32, 16, False, (20, 5), 5.0, False, False, None),  # MQA, window, softcap, Dv != D
    (2, 2, 2, 64, 100, 32, 32, True, (-1, -1), 0.0, True, False, (100, 17)),  # ALiBi, seq_lens
])
def test_one_pass_backward_variants(device, case, monkeypatch, fresh_caches):
    """The one-pass backward (launch_bwd.ONE_PASS; dq added up with atomics) under the 2x rule with the
    variants, as the two-kernel backward is in every other test of this file."""
    from diyflash.kernels.attention import launch_bwd

    monkeypatch.setattr(launch_bwd, "ONE_PASS", {pad: (0, None) for pad in (16, 32, 64, 128)})  # every call
    b, h, h_kv, n_q, n_k, d, dv, causal, window, softcap, alibi, sinks, seq_lens = case
    q, k, v = make(b, h, h_kv, n_q, n_k, d, dv, device=device)
    lens = None if seq_lens is None else torch.tensor(seq_lens, dtype=torch.int32, device=device)
    check(q, k, v, causal, seq_lens=lens, window=window, softcap=softcap,
          alibi=slopes(h, device=device) if alibi else None, sinks=sink_logits(h, device) if sinks else None)

@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("case", [
    # (b, h, h_kv, n_q, n_k, d, causal, window, softcap, layout)
    (2, 8, 2, 113, 47, 80, True, (-1, -1), 0.0, "bnhd"),  # group 4, tails, padded head_dim, N_q != N_k
    (1, 8, 1, 70, 113, 32, False, (20, 5), 5.0, "bhnd"),  # MQA group 8, window and softcap
])
def test_gqa_backward_split_over_programs(device, monkeypatch, parts, case, fresh_caches):
    """The dk/dv kernel with each kv head's query group split over `parts` programs (grids.head_split, as
    launch_bwd calls it, does so for GQA grids too small to fill the GPU; it never splits on CPU, so it is
    forced here), their fp32 partial sums added by _attn_bwd_group_sum_kernel: every gradient under the 2x
    rule, bitwise the same on the next calls (on the GPU a replayed plan with fresh scratch), and no copy of
    k or v."""
    from diyflash.kernels.attention import launch_bwd

    calls = []
    monkeypatch.setattr(launch_bwd, "head_split", lambda group, *_, **__: calls.append(group) or parts)
    diyflash.clear_caches()  # a plan's split follows from its key, except under this patch
    b, h, h_kv, n_q, n_k, d, causal, window, softcap, layout = case
    q, k, v = make(b, h, h_kv, n_q, n_k, d, device=device, layout=layout)
    check(q, k, v, causal, window=window, softcap=softcap, what=("out",))
    assert calls and set(calls) == {h // h_kv}
    dout = _randn(q.shape, q.dtype, device, seed=9)

    def grads():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = diyflash.flash_attention(*leaves, causal, window_size=window, softcap=softcap, deterministic=True)
        return torch.autograd.grad(out, leaves, dout)

    first = grads()
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    assert not copies_of(grads, k, v)


def test_gqa_split_must_divide_the_group(device):
    from diyflash.kernels.attention import launch as ka

    q, k, v = make(1, 8, 2, 17, 17, 16, device=device)
    out, lse = ka.attention_fwd(q, k, v, False, 0.25, None)
    with pytest.raises(ValueError, match="split=3 must divide the 4 query heads"):
        ka.attention_bwd(out, None, q, k, v, out, lse, False, 0.25, None, split=3)


def test_head_split_rule():
    """A GQA dk/dv grid is split over the smallest divisor of the group that gives it at least
    SPLIT_PROGRAMS_PER_SM programs per SM (and at most max_heads query heads a program where asked), at most
    the whole group; never without GQA, below SPLIT_MIN_WORK, or without a GPU."""
    from diyflash.kernels._runtime import DeviceLimits
    from diyflash.kernels.attention import grids as ka

    cuda = torch.device("cuda", 0)
    limits = {cuda: DeviceLimits(228 * 1024, True, 132)}
    work = 16 * 4096 * 4096 * 128  # B1 H16 N4096 D128
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ka, "device_limits", limits.get)
        mp.setattr(ka, "SPLIT_PROGRAMS_PER_SM", 1)
        mp.setattr(ka, "SPLIT_MIN_WORK", 1 << 32)
        assert ka.head_split(4, 128, work, cuda) == 2  # B1 H16/4 N4096, 128-key blocks: 128 < 132
        assert ka.head_split(4, 132, work, cuda) == 1
        assert ka.head_split(4, 64, work, cuda) == 4  # N2048: 2 parts still give too few
        assert ka.head_split(8, 16, work, cuda) == 8  # every part still too few: one query head a program
        assert ka.head_split(6, 25, work, cuda) == 6  # 2 and 3 divide 6 but give too few
        assert ka.head_split(6, 50, work, cuda) == 3
        assert ka.head_split(1, 8, work, cuda) == 1  # no GQA
        assert ka.head_split(8, 1024, work, cuda, max_heads=2) == 4  # a full grid, two query heads a program
        assert ka.head_split(6, 1024, work, cuda, max_heads=2) == 3
        assert ka.head_split(3, 1024, work, cuda, max_heads=2) == 3  # no divisor gives two: one head a program
        assert ka.head_split(4, 64, work, cuda, max_heads=2) == 4  # the grid's own need decides where larger
        assert ka.head_split(2, 1024, work, cuda, max_heads=2) == 1
        assert ka.head_split(4, 128, (1 << 32) - 1, cuda) == 1  # too little work: host-bound
        limits[cuda] = DeviceLimits(None, True, None)
        assert ka.head_split(4, 8, work, cuda) == 1


def test_pytorch_path_gradcheck_float64(torch_path):
    """The PyTorch path (float64) against autograd's numerical gradients, every variant on: q, k, v,
    sinks, with lse as a second output."""
    q, k, v = (t.requires_grad_() for t in make(2, 4, 2, 7, 9, 8, 16, dtype=torch.float64))
    sinks = sink_logits(4).double().requires_grad_()
    alibi = slopes(4, 2).double()

    def fn(q, k, v, s):
        out, lse = torch.ops.diyflash.attention_fwd(q, k, v, True, 0.4, None, 3, -1, 2.0, alibi, s)
        return out, lse

    assert torch.autograd.gradcheck(fn, (q, k, v, sinks), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_pytorch_path_matches_the_oracle(torch_path):
    q, k, v = make(2, 6, 3, 29, 41, 16, 8, dtype=torch.float64)
    kw = dict(window_size=(5, 2), softcap=3.0, alibi_slopes=slopes(6).double(), sinks=sink_logits(6).double())
    seq_lens = torch.tensor([41, 17], dtype=torch.int32)
    ours = torch.ops.diyflash.attention_fwd(q, k, v, False, None, seq_lens, 5, 2, 3.0, kw["alibi_slopes"], kw["sinks"])
    want = attention_ref(q, k, v, False, None, seq_lens, **kw)
    for a, b in zip(ours, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---- the ops: opcheck with the new arguments, compile, export, errors ---------------------------------


VARIANT_CASES = [
    # (h, h_kv, n_q, n_k, d, dv, causal, window, softcap, alibi, sinks, dtype)
    (4, 2, 17, 23, 16, 16, True, (5, -1), 0.0, False, False, torch.float32),
    (4, 1, 9, 9, 16, 8, False, (2, 2), 3.0, True, True, torch.float16),
    (2, 2, 13, 7, 16, 16, True, (-1, -1), 0.0, "batch", True, torch.float32),
]


def _variant_args(case, device, requires_grad=False):
    h, h_kv, n_q, n_k, d, dv, causal, window, softcap, alibi, sinks, dtype = case
    q, k, v = make(2, h, h_kv, n_q, n_k, d, dv, dtype=dtype, device=device)
    al = None if not alibi else slopes(h, 2 if alibi == "batch" else None, device)
    s = sink_logits(h, device) if sinks else None
    tensors = [t.requires_grad_(requires_grad) for t in (q, k, v)]
    if s is not None:
        s.requires_grad_(requires_grad)
    return (*tensors, causal, None, None, window[0], window[1], softcap, al, s)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("case", range(len(VARIANT_CASES)))
def test_opcheck_variants(device, case, requires_grad):
    args = _variant_args(VARIANT_CASES[case], device, requires_grad)
    torch.library.opcheck(torch.ops.diyflash.attention.default, args, test_utils="ALL")
    torch.library.opcheck(torch.ops.diyflash.attention_fwd.default, args, test_utils="ALL")


@pytest.mark.parametrize("case", range(len(VARIANT_CASES)))
def test_opcheck_variants_bwd(device, case):
    opcheck_backward(torch.ops.diyflash.attention_fwd, torch.ops.diyflash.attention_bwd.default,
                     _variant_args(VARIANT_CASES[case], device))


def test_compile_fullgraph_one_graph_across_lengths(device):
    """Every variant at once under torch.compile(fullgraph=True): 0 graph breaks, and after the first
    two lengths (static, then dynamic) no recompile across further lengths; eager and compiled agree."""
    torch._dynamo.reset()
    sinks = sink_logits(4, device).requires_grad_()
    alibi = slopes(4, 1, device)
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    def step(q, k, v):
        out, lse = diyflash.flash_attention(q, k, v, True, window_size=(12, -1), softcap=5.0, alibi_slopes=alibi,
                                            sinks=sinks, return_lse=True)
        return out.float().square().sum() + lse.sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for n in (33, 47, 61, 90):
        q, k, v = (t.requires_grad_() for t in make(1, 4, 2, n, n, 16, device=device))
        loss = compiled(q, k, v)
        loss.backward()
        eager_q = q.detach().requires_grad_()
        eager = step(eager_q, k.detach(), v.detach())
        torch.testing.assert_close(loss, eager)
    assert len(frames) == 2, f"{len(frames)} graphs for 4 lengths"
    explain = torch._dynamo.explain(step)(*make(1, 4, 2, 20, 20, 16, device=device))
    assert explain.graph_break_count == 0


def test_export_round_trip_with_variants(device, tmp_path):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sinks = torch.nn.Parameter(sink_logits(4, device))
            self.register_buffer("alibi", slopes(4, None, device))

        def forward(self, q, k, v):
            out, lse = diyflash.flash_attention(q, k, v, True, window_size=(8, -1), softcap=2.0,
                                                alibi_slopes=self.alibi, sinks=self.sinks, return_lse=True)
            return out, lse

    m = M()
    q, k, v = make(1, 4, 2, 40, 40, 16, device=device)
    ep = torch.export.export(m, (q, k, v))
    assert "diyflash.attention_fwd" in str(ep.graph)
    path = tmp_path / "variants.pt2"
    torch.export.save(ep, path)
    loaded = torch.export.load(path)
    for got, want in zip(loaded.module()(q, k, v), m(q, k, v)):
        torch.testing.assert_close(got, want)


def test_autocast_with_variants(device):
    q, k, v = make(1, 4, 2, 30, 30, 16, dtype=torch.float32, device=device)
    sinks = sink_logits(4, device)
    dtype = torch.bfloat16
    with torch.autocast(device.type, dtype=dtype):
        out, lse = diyflash.flash_attention(q, k, v, True, sinks=sinks, window_size=(4, -1), return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    want, _ = diyflash.flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), True, sinks=sinks, window_size=(4, -1),
                                       return_lse=True)
    assert torch.equal(out, want)


def _errors(device):
    q, k, v = make(2, 4, 2, 8, 8, 16, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    return [
        (dict(k=make(2, 4, 3, 8, 8, 16, device=device)[1], v=make(2, 4, 3, 8, 8, 16, device=device)[2]), ValueError,
         "number of query heads (4) must be a multiple of the number of kv heads (3)"),
        (dict(window_size=(-2, 3)), ValueError, "window left must be -1 (unbounded) or >= 0, got -2"),
        (dict(window_size=(3, -5)), ValueError, "window right must be -1 (unbounded) or >= 0, got -5"),
        (dict(window_size=(1.5, 3)), TypeError, "window left must be an int, got float 1.5"),
        (dict(softcap=-1.0), ValueError, "softcap must be 0 (off) or in [1.18e-38, 2.35e+38] (finite in fp32, also times log2(e)), got -1.0"),
        (dict(softcap=float("nan")), ValueError, "softcap must be 0 (off) or in"),
        (dict(alibi_slopes=torch.ones(3, **f32)), ValueError, "alibi_slopes must have shape (4,) or (2, 4), got (3,)"),
        (dict(alibi_slopes=torch.ones(4, dtype=torch.float16, device=device)), TypeError,
         "alibi_slopes must be float32, got torch.float16"),
        (dict(alibi_slopes=torch.ones(4, device="meta")), ValueError, "alibi_slopes must be on the inputs' device"),
        (dict(sinks=torch.ones(2, 4, **f32)), ValueError, "sinks must have shape (4,), got (2, 4)"),
        (dict(sinks=torch.ones(4, dtype=torch.float64, device=device)), TypeError, "sinks must be float32"),
        (dict(q=q.flatten(0, 1), k=k.repeat_interleave(2, 1).flatten(0, 1), v=v.repeat_interleave(2, 1).flatten(0, 1),
              sinks=torch.ones(4, **f32)), ValueError, "sinks needs 4-D inputs"),
        (dict(v=make(2, 4, 2, 8, 8, 16, 12, device=device)[2]), ValueError, "Unsupported head_dim 12"),
        (dict(v=make(2, 4, 2, 8, 8, 16, 264, device=device)[2]), ValueError, "Unsupported head_dim 264"),
    ]


@pytest.mark.parametrize("i", range(14))
def test_errors_name_the_values(device, i):
    q, k, v = make(2, 4, 2, 8, 8, 16, device=device)
    kw, exc, phrase = _errors(device)[i]
    args = dict(q=q, k=k, v=v)
    args.update({name: kw.pop(name) for name in ("q", "k", "v") if name in kw})
    with pytest.raises(exc) as api:
        diyflash.flash_attention(args["q"], args["k"], args["v"], True, **kw)
    assert phrase in str(api.value)
    # the op says the same, from its real and its fake kernel
    window = kw.pop("window_size", (-1, -1))
    op_args = (args["q"], args["k"], args["v"], True, None, None, window[0], window[1], kw.get("softcap", 0.0),
               kw.get("alibi_slopes"), kw.get("sinks"))
    if isinstance(window[0], float):
        return  # the op's schema itself refuses a float for an int argument
    with pytest.raises(exc) as op:
        torch.ops.diyflash.attention_fwd(*op_args)
    assert phrase in str(op.value) and "diyflash::attention_fwd" in str(op.value)
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(exc):
            torch.ops.diyflash.attention_fwd(*op_args)


def test_no_nan_from_large_softcapped_scores(device):
    q, k, v = make(1, 2, 2, 64, 64, 16, device=device)
    out = diyflash.flash_attention(q * 1000, k * 1000, v, True, softcap=30.0, sinks=sink_logits(2, device))
    assert torch.isfinite(out).all()
