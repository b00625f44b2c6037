"""The Hopper backward (kernels/attention/backward_sm90.py, a one-pass warp-specialized Gluon kernel): that it
computes the portable kernels' gradients, where it runs, and that everything else falls back to them.

CPU (CI): it compiles for sm_90a (tests/test_hopper_builds.py builds it beside the forward), and
which calls take it (the call rule, with the device's answers mocked). GPU (an
H100/H200): gradients of every case on both backends under the 2x rule against the float64 oracle, which
kernels each backward ran, determinism, strided views, sinks, compile."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import diyflash
from diyflash.kernels.attention import hopper
from diyflash.reference import attention_ref
from diyflash.utils.validation import compare_with_oracle, error_report
from helpers import check_varlen, cu, hopper_here, kernels_run, make_qkv, packed, random_like, sink_logits, slopes

needs_hopper = pytest.mark.skipif(not hopper_here(), reason="needs an sm_90 GPU with Triton's Gluon Hopper API")


def _backward_kernels(call) -> set[str]:
    """Which backward kernels call() (a forward and its backward) launched: {"hopper", "portable"}."""
    return kernels_run(call, "_hopper_bwd_kernel", "_attn_bwd_dkdv_kernel")


CASES = [  # (B, H, H_kv, N_q, N_k, causal, window, softcap, head_dim)
    (2, 4, 2, 1000, 1000, True, (-1, -1), 0.0, 128),
    (2, 4, 2, 1024, 1024, False, (-1, -1), 0.0, 128),
    (1, 8, 1, 300, 1000, True, (-1, -1), 0.0, 128),  # N_q < N_k, GQA 8
    (1, 2, 2, 1023, 300, True, (-1, -1), 0.0, 128),  # rows that see no key; N_q not a multiple of 4
    (1, 4, 1, 1500, 1500, True, (256, 0), 30.0, 128),  # a causal window with softcap, GQA 4
    (1, 4, 1, 17, 113, False, (20, 7), 0.0, 128),
    (2, 2, 2, 113, 17, True, (-1, -1), 0.0, 128),
    (1, 4, 4, 1, 1, False, (-1, -1), 0.0, 128),
    (1, 2, 1, 4097, 4097, True, (-1, -1), 0.0, 128),
    # head_dim 64: one dq panel a warpgroup; without masks 128 query rows a step (hopper.BWD_WIDE_TILES)
    (2, 4, 2, 1000, 1000, True, (-1, -1), 0.0, 64),
    (1, 8, 1, 1024, 300, False, (-1, -1), 0.0, 64),
    (2, 3, 3, 900, 333, False, (-1, -1), 0.0, 64),  # a head's last 128-row step past its 960 accumulator rows
    (1, 4, 1, 1500, 1500, True, (256, 0), 30.0, 64),
    (2, 2, 2, 113, 17, False, (20, 7), 0.0, 64),
]


def _grads(q, k, v, dout, **kw):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(diyflash.flash_attention(q, k, v, **kw), (q, k, v), dout)


def _oracle_reports(q, k, v, dout, sinks=None, **kw):
    """The 2x rule's reports of out and its gradients (dsinks too, with sinks) of the default backward
    (deterministic=False) against the float64 oracle (utils.validation.compare_with_oracle)."""
    inputs, names = (q, k, v), ("dq", "dk", "dv")
    if sinks is not None:
        inputs, names = (*inputs, sinks), (*names, "dsinks")
    return compare_with_oracle(
        lambda q, k, v, *s: diyflash.flash_attention(q, k, v, sinks=s[0] if s else None, deterministic=False, **kw),
        lambda q, k, v, *s, upcast: attention_ref(q, k, v, sinks=s[0] if s else None, upcast=upcast, **kw)[0],
        inputs, "out", names, dout=dout)[2]


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_both_backends_within_2x(fresh_caches, backend, case, dtype):
    b, h, h_kv, n_q, n_k, causal, window, softcap, d = case
    q = make_qkv(b, h, n_q, n_q, d, dtype, seed=1)[0]
    k, v = make_qkv(b, h_kv, n_k, n_k, d, dtype, seed=2)[1:]
    dout = random_like(q, seed=3)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    for report in _oracle_reports(q, k, v, dout, **kw):
        assert report.ok, str(report)
    ran = _backward_kernels(lambda: _grads(q, k, v, dout, deterministic=False, **kw))
    assert ran == ({"hopper"} if backend == "hopper" else {"portable"}), ran


def test_the_call_rule(monkeypatch):
    """Which backward calls hopper.backward_runs gives the Hopper kernel (CPU: the device's answers mocked):
    fp16/bf16 at head_dim 64 and 128, not deterministic, with seq_lens and packed sequences too (not more of
    them than a grid's z dimension takes); never ALiBi, fp32, head_dim 80, Dv != D, determinism or
    one_pass=False; short calls, and head_dim-64 calls whose programs walk fewer query rows than
    hopper.BWD_MIN_ROWS, only under "hopper"."""
    monkeypatch.setattr(hopper, "status", lambda device: (True, "mocked"))
    monkeypatch.setattr(hopper, "backward_module", lambda: object())

    def t(d=128, dtype=torch.bfloat16):
        return SimpleNamespace(is_cuda=True, dtype=dtype, shape=(1, 2, 4096, d), device="cuda")

    lens = torch.zeros(3, dtype=torch.int32)
    too_many = torch.zeros(hopper.MAX_PACKED_SEQUENCES + 2, dtype=torch.int32)  # cu_seqlens: one more sequence

    def runs(q=None, v=None, seq_lens=None, packed=None, alibi=None, deterministic=False, one_pass=None, short=False,
             rows=None):
        q = q or t()
        return hopper.backward_runs(q, v or q, seq_lens, packed, alibi, False, deterministic, one_pass,
                                    lambda: True, short, rows)

    for backend in ("auto", "hopper"):
        monkeypatch.setattr(hopper, "_backend", backend)
        assert runs() and runs(t(64)) and runs(t(128, torch.float16)) and runs(seq_lens=lens), backend
        assert runs(packed=object(), seq_lens=lens) and not runs(packed=object(), seq_lens=too_many), backend
        assert runs(short=True) == (backend == "hopper")
        few = hopper.BWD_MIN_ROWS[64] - 1
        assert runs(t(64), rows=few) == (backend == "hopper") and runs(t(64), rows=few + 1), backend
        assert runs(t(128), rows=few), backend  # head_dim 128 has no such bound
        assert not any([runs(alibi=lens), runs(t(128, torch.float32)), runs(t(80)), runs(t(128), t(64)),
                        runs(deterministic=True), runs(one_pass=False)]), backend
    monkeypatch.setattr(hopper, "_backend", "portable")
    assert not runs()


def test_wide_tiles_only_without_masks():
    """128 query rows a step (hopper.BWD_WIDE_TILES) at head_dim 64 only for calls without causal, window,
    softcap or packed sequences (measured slower on causal cells); every tile a multiple of dq's 64-row tiles."""
    plain = dict(causal=False, window=False, softcap=False, packed=False)
    assert hopper.bwd_wide(64, **plain)
    assert not any([hopper.bwd_wide(64, **{**plain, flag: True}) for flag in plain] + [hopper.bwd_wide(128, **plain)])
    assert hopper.bwd_meta(64, wide=True)["BLOCK_M"] == 128 and hopper.bwd_meta(64)["BLOCK_M"] == 64
    q_block = dict((spec[0], spec[1]) for spec in hopper.bwd_descriptors(64, wide=True) if isinstance(spec[1], int))
    assert q_block["q"] == q_block["dout"] == 128
    tiles = (*hopper.BWD_TILES.values(), *hopper.BWD_WIDE_TILES.values())
    assert hopper.BWD_DQ_TILE == 64 and all(rows % hopper.BWD_DQ_TILE == 0 for rows, *_ in tiles)


@pytest.mark.parametrize("dtype,unprescale,power", [(torch.float32, False, 1.0), (torch.float32, True, 2.0),
                                                    (torch.float16, True, 1.0), (torch.bfloat16, True, 2.0)])
@pytest.mark.parametrize("d", [64, 128])
def test_flat_dq_accumulator_reads_back(device, d, dtype, unprescale, power):
    """The dq convert pass reads the Hopper backward's fp32 accumulator back (CPU: the interpreter): each
    64-row tile's two warpgroup halves in backward_sm90._store_dq's order, built here with torch's reshape and
    permute as the kernel's Gluon code builds it, N_q rounded up to 64 rows a head (hopper.bwd_dq_rows; the
    padding rows hold values that must not reach dq), into a strided dq, times the scale; with unprescale
    (the Hopper backward's, whose adds hold ds . k with k times qk_scale's power of two p2) also times 1 / p2:
    qk_scale = 0.5 log2(e) = 0.72 lies in [1/2, 1), so p2 = 1/2 and the factor is 2 (1 for fp16: not prescaled)."""
    from diyflash.kernels.attention import launch_bwd
    from diyflash.kernels.attention.backward_rows import _attn_bwd_dq_convert_kernel
    from diyflash.kernels.attention.semantics import LOG2E

    # the row passes' blocks are the accumulator's 64-row tiles (their padding and order assume it)
    assert launch_bwd.PRE_BLOCK == 64
    z, h, n = 2, 3, 100
    rows = hopper.bwd_dq_rows(n, packed=False)
    assert rows == 128 and hopper.bwd_dq_rows(n, packed=True) == n
    dq = torch.randn(z, h, rows, d, device=device)
    # (tile, warpgroup, r // 16, r // 8 % 2, r % 8, c // 8, c % 8 // 2, c % 2) -> _store_dq's order
    halves = dq.view(z, h, rows // 64, 64, 2, d // 2).transpose(3, 4)
    acc = halves.reshape(z, h, rows // 64, 2, 4, 2, 8, d // 16, 4, 2).permute(0, 1, 2, 3, 7, 4, 6, 8, 5, 9).contiguous()
    out = torch.full((z, n, h, d), float("nan"), device=device, dtype=dtype).transpose(1, 2)
    _attn_bwd_dq_convert_kernel[(-(-n // 64), h, z)](acc, out, *out.stride(), h, n, rows, 0.5, 0.5 * LOG2E,
                                                    HEAD_DIM=d, HEAD_DIM_PAD=d, BLOCK_M=64, FLAT=True,
                                                    UNPRESCALE=unprescale)
    want = dq[:, :, :n] * (0.5 * power)  # powers of two: exact in fp32
    if dtype == torch.bfloat16:  # within an ulp: the interpreter's float -> bf16 truncates, a GPU's rounds
        torch.testing.assert_close(out.float(), want, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(out, want.to(dtype))


@pytest.mark.parametrize("dtype,scale", [(torch.float16, 0.5), (torch.bfloat16, 0.5), (torch.bfloat16, 3.0),
                                         (torch.float32, 1 / 11.3)])
def test_preprocess_stores_the_shifted_stats(device, dtype, scale):
    """The preprocess's SHIFTED stats (CPU: the interpreter), which the Hopper backward's STATS_ACC tiles start
    at as they are: -lse2 / qk_rest and -delta (semantics._stats_shifted), qk_rest = qk_scale times 1 / p2 of
    semantics._prescaled (p2 the power of two of qk_scale's exponent, at most 1; fp16 operands are not
    prescaled: qk_rest = qk_scale): exact in the interpreter, within 2^-21 relative on a GPU, whose fp32
    division (div.full.f32, as the kernel's own 1 / qk_rest was) is within 2 ulps; a row that saw no key (lse
    -inf) and the padding rows past N_q -inf, so that p = 0 there."""
    import math

    from diyflash.kernels.contract import LOG2E  # the host's, which attention_bwd's qk_scale takes
    from diyflash.kernels.attention.backward_rows import _attn_bwd_preprocess_kernel

    z, h, n, d, rows = 2, 3, 70, 64, 72
    out, dout = (torch.randn(z, n, h, d, device=device, dtype=dtype).transpose(1, 2) for _ in range(2))
    lse = torch.randn(z, h, n, device=device) * 4
    lse[0, 1, 5] = float("-inf")
    delta, lse2 = (torch.full((z, h, rows), float("nan"), device=device) for _ in range(2))
    qk_scale = scale * LOG2E
    _attn_bwd_preprocess_kernel[(-(-n // 64), h, z)](
        out, dout, lse, lse, delta, lse2, lse, *out.stride(), *dout.stride(), *lse.stride(), 0, 0, 0, h, n, rows,
        rows, qk_scale, HEAD_DIM=d, HEAD_DIM_PAD=d, BLOCK_M=64, HAS_DLSE=False, ZERO_DQ=False, HEAD_DIM_Q=d,
        HEAD_DIM_Q_PAD=d, SHIFTED=True)
    p2 = 1.0 if dtype == torch.float16 else min(2.0 ** (math.frexp(qk_scale)[1] - 1), 1.0)
    rest = torch.tensor(qk_scale, dtype=torch.float32) * torch.tensor(1 / p2, dtype=torch.float32)  # fp32, exact
    raw = torch.where(lse == float("-inf"), float("inf"), lse * torch.tensor(LOG2E, dtype=torch.float32))
    want_lse = 0.0 - raw * (1.0 / rest.to(device))
    exact = device.type == "cpu"
    torch.testing.assert_close(lse2[..., :n], want_lse, rtol=0 if exact else 2 ** -21, atol=0)
    assert lse2[0, 1, 5] == float("-inf")
    assert bool((lse2[..., n:] == float("-inf")).all()), lse2[..., n:]
    want_delta = -(out.float() * dout.float()).sum(-1)
    torch.testing.assert_close(delta[..., :n], want_delta, rtol=1e-5, atol=1e-5)
    assert bool((delta[..., n:] == 0).all()), delta[..., n:]


@needs_hopper
def test_dk_dv_are_reproducible_and_dq_close(fresh_caches):
    """dk and dv come from the program that owns their keys, in a fixed order: bitwise equal call after call
    and on strided (b, n, h, d) views read in place; dq's TMA adds land in any order: within a few ulps."""
    hopper.use("hopper")
    try:
        q, k, v = make_qkv(2, 4, 1000, 1000, 128, torch.bfloat16)
        dout = random_like(q)
        first = _grads(q, k, v, dout, causal=True, deterministic=False)
        again = _grads(q, k, v, dout, causal=True, deterministic=False)
        qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # (b, n, h, d) storage
        strided = _grads(qs, ks, vs, dout, causal=True, deterministic=False)
        assert _backward_kernels(lambda: _grads(qs, ks, vs, dout, causal=True, deterministic=False)) == {"hopper"}
        for other in (again, strided):
            assert torch.equal(first[1], other[1]) and torch.equal(first[2], other[2])
            torch.testing.assert_close(first[0], other[0], atol=1e-2, rtol=1e-2)
        spread = (first[0].float() - again[0].float()).abs().max().item()
        print(f"dq run-to-run spread (bf16, B2 H4 N1000 causal): {spread:.3g}")
    finally:
        hopper.use("auto")


@needs_hopper
def test_what_falls_back_to_portable(fresh_caches, monkeypatch):
    """Backward calls the Hopper kernel does not take run the portable kernels: determinism asked for (the
    argument or torch's switch), the two-kernel backward asked for, ALiBi, fp32, other head dims."""
    hopper.use("hopper")
    try:
        q, k, v = make_qkv(2, 4, 256, 256, 128, torch.bfloat16)
        dout = random_like(q)
        run = lambda **kw: _backward_kernels(lambda: _grads(q, k, v, dout, **kw))  # noqa: E731
        assert run(deterministic=False) == {"hopper"}
        assert run(deterministic=None) == {"hopper"}
        others = {
            "deterministic": dict(deterministic=True),
            "alibi": dict(deterministic=False, alibi_slopes=slopes(4, device="cuda")),
        }
        for name, kw in others.items():
            assert run(**kw) == {"portable"}, name
        with monkeypatch.context() as m:
            m.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
            assert run() == {"portable"}, "torch.use_deterministic_algorithms"
        q80, k80, v80 = (t[..., :80].contiguous() for t in (q, k, v))
        assert _backward_kernels(lambda: _grads(q80, k80, v80, dout[..., :80].contiguous(),
                                                deterministic=False)) == {"portable"}
        q32, k32, v32 = (t.float() for t in (q, k, v))
        assert _backward_kernels(lambda: _grads(q32, k32, v32, dout.float(), deterministic=False)) == {"portable"}
    finally:
        hopper.use("auto")


@needs_hopper
def test_sinks_and_auto(fresh_caches):
    """Sinks: the forward runs the portable kernel, the backward the Hopper one (the saved lse includes the
    sinks), within the 2x rule, the sinks' own gradient too. "auto" leaves a short call's backward to the
    portable kernels and takes a long one's."""
    q, k, v = make_qkv(1, 4, 700, 700, 128, torch.bfloat16, seed=5)
    sinks = sink_logits(4, device="cuda")
    dout = random_like(q, seed=6)
    hopper.use("hopper")
    try:
        for report in _oracle_reports(q, k, v, dout, sinks, causal=True):
            assert report.ok, str(report)
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
        assert _backward_kernels(lambda: torch.autograd.grad(diyflash.flash_attention(
            *leaves[:3], causal=True, sinks=leaves[3], deterministic=False), leaves, dout)) == {"hopper"}
    finally:
        hopper.use("auto")
    short = make_qkv(1, 32, 128, 128, 128, torch.bfloat16, seed=7)
    assert _backward_kernels(lambda: _grads(*short, random_like(short[0]), deterministic=False)) == {"portable"}
    long = make_qkv(1, 2, 4096, 4096, 128, torch.bfloat16, seed=8)  # work 2^32: plans.HOST_DESC_MIN_WORK
    assert _backward_kernels(lambda: _grads(*long, random_like(long[0]), deterministic=False)) == {"hopper"}


@needs_hopper
def test_auto_leaves_few_rows_a_program_at_d64(fresh_caches):
    """At head_dim 64 "auto" leaves the portable kernels a backward whose programs walk fewer query rows than
    hopper.BWD_MIN_ROWS (a kv head's query heads x N_q), however much work the call has; GQA reaches it."""
    dout_of = lambda q: random_like(q, seed=10)  # noqa: E731
    mha = make_qkv(64, 16, 512, 512, 64, torch.float16, seed=9)  # work 2^34, 512 rows a program
    gqa = (mha[0], *make_qkv(64, 8, 512, 512, 64, torch.float16, seed=11)[1:])  # GQA 16/8: 2 x 512 rows
    assert _backward_kernels(lambda: _grads(*mha, dout_of(mha[0]), causal=True, deterministic=False)) == {"portable"}
    assert _backward_kernels(lambda: _grads(*gqa, dout_of(gqa[0]), causal=True, deterministic=False)) == {"hopper"}
    hopper.use("hopper")
    try:
        assert _backward_kernels(lambda: _grads(*mha, dout_of(mha[0]), causal=True, deterministic=False)) == {"hopper"}
    finally:
        hopper.use("auto")


@needs_hopper
def test_compiled_and_replayed(fresh_caches):
    """Under torch.compile (fullgraph) and from a kept plan: the same dk, dv bit for bit, dq within ulps."""
    q, k, v = make_qkv(1, 4, 4096, 4096, 128, torch.bfloat16)
    dout = random_like(q)
    eager = _grads(q, k, v, dout, causal=True, deterministic=False)
    kept = _grads(q, k, v, dout, causal=True, deterministic=False)
    f = torch.compile(lambda q, k, v: diyflash.flash_attention(q, k, v, causal=True, deterministic=False),
                      fullgraph=True)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    compiled = torch.autograd.grad(f(*leaves), leaves, dout)
    for other in (kept, compiled):
        assert torch.equal(eager[1], other[1]) and torch.equal(eager[2], other[2])
        torch.testing.assert_close(eager[0], other[0], atol=1e-2, rtol=1e-2)


@needs_hopper
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_query_head_group_split(fresh_caches, monkeypatch, parts):
    """A small GQA grid splits each kv head's query heads over `parts` programs (grids.head_split), whose fp32
    partial dk and dv a last launch adds up: within the 2x rule for every split, causal and windowed."""
    from diyflash.kernels.attention import launch_bwd

    monkeypatch.setattr(launch_bwd, "head_split", lambda kv_group, programs, work, device, **_: parts)
    hopper.use("hopper")
    try:
        q = make_qkv(1, 8, 700, 700, 128, torch.bfloat16, seed=11)[0]
        k, v = make_qkv(1, 2, 700, 700, 128, torch.bfloat16, seed=12)[1:]
        dout = random_like(q, seed=13)
        for kw in (dict(causal=True), dict(causal=True, window_size=(200, 0))):
            for report in _oracle_reports(q, k, v, dout, **kw):
                assert report.ok, (parts, kw, str(report))
            assert _backward_kernels(lambda: _grads(q, k, v, dout, deterministic=False, **kw)) == {"hopper"}
    finally:
        hopper.use("auto")


@needs_hopper
def test_causal_gqa_programs_walk_few_query_heads(fresh_caches, monkeypatch):
    """A causal GQA backward without a window splits its query-head groups to hopper.BWD_GROUP_HEADS heads a
    program (head_split's max_heads) from hopper.BWD_GROUP_MIN_ROWS query rows (lowered here to the test's
    2048); a window and a non-causal call keep whole groups where the grid is full. Checked call by call: the
    Hopper launch passes max_heads (None for whole groups); an ask without it (the portable backward's split)
    is not the Hopper launch's and is left out."""
    from diyflash.kernels.attention import launch_bwd

    monkeypatch.setattr(hopper, "BWD_GROUP_MIN_ROWS", 2048)
    asked = []
    real = launch_bwd.head_split
    monkeypatch.setattr(launch_bwd, "head_split",
                        lambda *args, **kw: asked.append(kw.get("max_heads", "not passed")) or real(*args, **kw))
    hopper.use("hopper")
    hopper_asks = {}
    try:
        q = make_qkv(1, 8, 2048, 2048, 128, torch.bfloat16, seed=21)[0]  # 2^32 work: the split's least
        k, v = make_qkv(1, 1, 2048, 2048, 128, torch.bfloat16, seed=22)[1:]
        dout = random_like(q, seed=23)
        for name, kw in (("causal", dict(causal=True)), ("window", dict(causal=True, window_size=(512, 0))),
                         ("full", dict(causal=False))):
            diyflash.clear_caches()
            asked.clear()
            for report in _oracle_reports(q, k, v, dout, **kw):
                assert report.ok, (kw, str(report))
            hopper_asks[name] = [a for a in asked if a != "not passed"]
    finally:
        hopper.use("auto")
    assert hopper_asks["causal"] and set(hopper_asks["causal"]) == {hopper.BWD_GROUP_HEADS}, hopper_asks
    assert hopper_asks["window"] and set(hopper_asks["window"]) == {None}, hopper_asks
    assert hopper_asks["full"] and set(hopper_asks["full"]) == {None}, hopper_asks


@needs_hopper
def test_lse_gradient(fresh_caches):
    """A loss on lse too (return_lse=True): its gradient joins delta in the preprocess, as on the portable
    path; within the 2x rule on the Hopper backward."""
    hopper.use("hopper")
    try:
        q, k, v = make_qkv(1, 4, 600, 700, 128, torch.bfloat16, seed=21)
        dout, dlse = random_like(q, seed=22), random_like(q[..., 0], seed=23).float()

        def loss_grads(fn, leaves):
            out, lse = fn(*leaves)
            return torch.autograd.grad((out.double() * dout.double()).sum() + (lse.double() * dlse.double()).sum(),
                                       leaves)

        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fn = lambda q, k, v: diyflash.flash_attention(q, k, v, causal=True, return_lse=True,  # noqa: E731
                                                      deterministic=False)
        got = loss_grads(fn, leaves)
        want = loss_grads(lambda q, k, v: attention_ref(q, k, v, causal=True),
                          [t.detach().double().requires_grad_() for t in (q, k, v)])
        base = loss_grads(lambda q, k, v: attention_ref(q, k, v, causal=True, upcast=False),
                          [t.detach().clone().requires_grad_() for t in (q, k, v)])
        for n, a, r, p in zip(("dq", "dk", "dv"), got, want, base):
            report = error_report(n, a, r, p)
            assert report.ok, str(report)
        assert _backward_kernels(lambda: loss_grads(fn, leaves)) == {"hopper"}
    finally:
        hopper.use("auto")


@needs_hopper
@pytest.mark.parametrize("d", [64, 128])
def test_seq_lens(fresh_caches, backend, d):
    """seq_lens (each batch row's valid length; both lengths capped, the diagonal at N_k - N_q): within the 2x
    rule on both backends, lengths 1 and N included; padding keys get dk = dv = 0."""
    q, k, v = make_qkv(3, 4, 700, 700, d, torch.bfloat16, seed=31)
    dout = random_like(q, seed=32)
    lens = torch.tensor([700, 1, 300], dtype=torch.int32, device="cuda")
    for causal in (True, False):
        for report in _oracle_reports(q, k, v, dout, causal=causal, seq_lens=lens):
            assert report.ok, (causal, str(report))
    ran = _backward_kernels(lambda: _grads(q, k, v, dout, causal=True, seq_lens=lens, deterministic=False))
    assert ran == ({"hopper"} if backend == "hopper" else {"portable"}), ran
    dk, dv = _grads(q, k, v, dout, causal=True, seq_lens=lens, deterministic=False)[1:]
    assert not dk[1, :, 1:].any() and not dv[2, :, 300:].any()


PACKED = [  # (lens_q, lens_k, H, H_kv, causal, window, head_dim)
    ([1000, 17, 0, 1, 300], [1000, 17, 0, 1, 300], 4, 2, True, (-1, -1), 128),  # lengths 0, 1, 17; rows unaligned
    ([113, 700, 64], [300, 700, 1023], 8, 1, True, (-1, -1), 128),  # N_q != N_k a sequence, GQA 8
    ([257, 1, 600], [100, 513, 600], 2, 2, False, (-1, -1), 128),
    ([500, 129, 3], [500, 129, 3], 4, 1, True, (256, 0), 64),  # a window, D64
    ([33, 1000], [60, 1000], 4, 4, False, (20, 7), 64),
]


@needs_hopper
@pytest.mark.parametrize("case", PACKED)
def test_packed_sequences(fresh_caches, backend, case):
    """Packed sequences (flash_attention_varlen): out, dq, dk, dv (and dq, dk through a loss on lse) within the
    2x rule on both backends; on the Hopper backward each sequence's programs store only its keys, and its dq
    tiles add zeros into the next sequence's rows."""
    lens_q, lens_k, h, h_kv, causal, window, d = case
    q, k, v = packed(lens_q, lens_k, h, h_kv, d, dtype=torch.bfloat16, device="cuda", seed=41)
    check_varlen(q, k, v, lens_q, lens_k, causal=causal, window=window)
    cu_q, cu_k = cu(lens_q, "cuda"), cu(lens_k, "cuda")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    dout = random_like(q, seed=42)
    ran = _backward_kernels(lambda: torch.autograd.grad(diyflash.flash_attention_varlen(
        *leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal, window_size=window, deterministic=False), leaves, dout))
    assert ran == ({"hopper"} if backend == "hopper" else {"portable"}), ran
