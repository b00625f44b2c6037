"""Numerics of out, dq, dk, dv against a float64 oracle, with flash-attn's 2x-plain-PyTorch rule.

The same file runs on CPU (Triton interpreter, tiny shapes) and on CUDA (adds large shapes).
"""

import pytest
import torch

import diyflash  # noqa: F401  (registers the ops)
from diyflash.reference import attention_ref
from helpers import DTYPES, ON_GPU, cancellation_bands, check_attention, copies_of, make_qkv, random_like

LENGTHS = [(1, 1), (17, 17), (113, 113), (17, 113), (113, 17), (1, 113), (64, 1), (64, 128), (128, 128)]


@pytest.mark.parametrize("n_q,n_k", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_lengths(device, dtype, causal, n_q, n_k):
    q, k, v = make_qkv(1, 2, n_q, n_k, 32, dtype, device, requires_grad=True)
    check_attention(q, k, v, causal)


@pytest.mark.parametrize("head_dim", [8, 16, 24, 80, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(device, head_dim, causal):
    q, k, v = make_qkv(1, 2, 47, 33, head_dim, torch.float16, device, requires_grad=True)
    check_attention(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_length_1023(device, causal):
    q, k, v = make_qkv(1, 1, 1023, 1023, 16, torch.float16, device, requires_grad=True)
    check_attention(q, k, v, causal)


ONE_PASS_LENGTHS = [(1, 1), (17, 113), (113, 17), (1, 113), (1023, 1023),
                    pytest.param(4097, 4097, marks=pytest.mark.skipif(not ON_GPU, reason="the interpreter would take hours"))]


@pytest.mark.parametrize("n_q,n_k", ONE_PASS_LENGTHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_pass_lengths(device, dtype, n_q, n_k, monkeypatch, fresh_caches):
    """The one-pass backward (launch_bwd.ONE_PASS forced on every call) under the 2x rule across the length
    classes, causal (the masked first and tail loops; test_one_pass_backward_variants has the rest)."""
    from diyflash.kernels.attention import launch_bwd

    monkeypatch.setattr(launch_bwd, "ONE_PASS", {pad: (0, None) for pad in (16, 32, 64, 128)})
    d = 16 if n_q == 1023 else 32
    q, k, v = make_qkv(1, 2 if n_q < 1000 else 1, n_q, n_k, d, dtype, device, requires_grad=True)
    check_attention(q, k, v, True)


@pytest.mark.parametrize("layout", ["bnhd", "3d", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_layouts(device, layout, dtype):
    q, k, v = make_qkv(2, 3, 37, 50, 32, dtype, device, layout=layout, requires_grad=True)
    out = check_attention(q, k, v, causal=True)
    if layout == "bnhd":
        # the output keeps q's memory layout: (B, N, H, D) storage, so out.transpose(1, 2) is free
        assert out.stride() == q.stride()


def test_permuted_inputs_are_not_copied(device):
    """(B, H, N, D) views of (B, N, H, D) storage go to the kernels as they are, forward and backward."""
    q, k, v = make_qkv(2, 3, 40, 40, 32, torch.float16, device, layout="bnhd", requires_grad=True)

    dout = random_like(q).transpose(1, 2).contiguous().transpose(1, 2)  # permuted like q

    def step():
        torch.ops.diyflash.attention(q, k, v, causal=True).backward(dout)

    assert not copies_of(step, q)
    assert copies_of(lambda: q.contiguous(), q)  # the check sees a copy when there is one


# 0 and negative scales take the forward's unfolded path (the row max of the raw dot no longer scales
# to the max of the scaled scores); both causal settings cover its masked and unmasked blocks
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [0.05, 1.0, 0.0, -0.4])
def test_explicit_scale(device, scale, causal):
    q, k, v = make_qkv(1, 2, 45, 70, 32, torch.float16, device, requires_grad=True)
    check_attention(q, k, v, causal=causal, scale=scale)


@pytest.mark.parametrize("n_q,n_k", [(64, 64), (40, 64), (64, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_seq_lens(device, causal, n_q, n_k):
    q, k, v = make_qkv(3, 2, n_q, n_k, 16, torch.float16, device, requires_grad=True)
    seq_lens = torch.tensor([min(n_q, n_k), 1, 23], dtype=torch.int32, device=device)
    out = check_attention(q, k, v, causal, seq_lens=seq_lens)
    # padding rows are exactly zero
    assert (out[1, :, 1:] == 0).all() and (out[2, :, 23:] == 0).all()


def test_fully_masked_rows(device):
    """Causal with N_q > N_k: the first N_q - N_k rows see no key: out 0, lse -inf, grads finite."""
    q, k, v = make_qkv(1, 2, 50, 20, 16, torch.float16, device, requires_grad=True)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, True, None, None)
    assert (out[:, :, :30] == 0).all()
    assert torch.isneginf(lse[:, :, :30]).all() and torch.isfinite(lse[:, :, 30:]).all()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), random_like(out))
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert (dq[:, :, :30] == 0).all()
    check_attention(q, k, v, causal=True)


def test_lse_matches_reference(device):
    q, k, v = make_qkv(2, 2, 45, 61, 32, torch.float32, device)
    _, lse = torch.ops.diyflash.attention_fwd(q, k, v, True, None, None)
    _, ref = attention_ref(q, k, v, causal=True)
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), ref, rtol=0, atol=1e-5)


def test_lse_gradient(device):
    """attention_fwd's lse is differentiable too (d lse / d s = p): checked against the oracle."""
    q, k, v = make_qkv(1, 2, 33, 40, 16, torch.float32, device, requires_grad=True)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, True, None, None)
    w = random_like(lse)
    loss = (out * random_like(out)).sum() + (lse * w).sum()
    got = torch.autograd.grad(loss, (q, k, v))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ro, rl = attention_ref(*leaves, causal=True)
    ref_loss = (ro * random_like(out).double()).sum() + (rl * w.double()).sum()
    want = torch.autograd.grad(ref_loss, leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)


def test_zero_stride_grad(device):
    """out.sum().backward() hands the backward a (0, 0, 0, 0)-strided gradient. (Not bitwise equal to
    a contiguous ones gradient on GPU: Triton specialises stride == 1 loads, which changes the
    reduction layout of delta = rowsum(dout * out).)"""
    q, k, v = make_qkv(1, 2, 21, 21, 16, torch.float32, device, requires_grad=True)
    torch.ops.diyflash.attention(q, k, v, causal=True).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out = torch.ops.diyflash.attention(q, k, v, causal=True)
    out.backward(torch.ones_like(out))
    for a, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(a, t.grad, rtol=1e-5, atol=1e-6)


class _Spy:
    """A launcher that logs its name in `log` when it launches or binds (a plan), then does so (and compiles
    ahead where asked, unlogged)."""

    def __init__(self, launcher, name: str, log: list):
        self.launcher, self.name, self.log = launcher, name, log

    def __call__(self, *args, **kwargs):
        self.log.append(self.name)
        return self.launcher(*args, **kwargs)

    def bind(self, *args, **kwargs):
        self.log.append(self.name)
        return self.launcher.bind(*args, **kwargs)

    def compile_ahead(self, *args):  # not a launch: not logged
        return self.launcher.compile_ahead(*args)


def _spy_dq_launchers(monkeypatch) -> list:
    from diyflash.kernels.attention import launch_bwd

    log = []
    for name in ("_BWD_DQ", "_BWD_DQ_CONVERT"):
        monkeypatch.setattr(launch_bwd, name, _Spy(getattr(launch_bwd, name), name, log))
    return log


@pytest.mark.parametrize("how", ["argument", "torch"])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_is_deterministic(device, causal, how, monkeypatch, fresh_caches):
    """deterministic=True, or torch.use_deterministic_algorithms(True) with the argument left at None: the
    two-kernel backward (its dq kernel, no atomic adds) even where the one-pass one is the default
    (launch_bwd.ONE_PASS), gradients bitwise equal call after call."""
    from diyflash.kernels.attention import launch_bwd

    monkeypatch.setattr(launch_bwd, "ONE_PASS", {pad: (0, None) for pad in (16, 32, 64, 128)})  # every call
    launched = _spy_dq_launchers(monkeypatch)
    q, k, v = make_qkv(2, 2, 77, 90, 32, torch.float16, device, requires_grad=True)
    g = random_like(q)

    def grads():
        out = torch.ops.diyflash.attention(q, k, v, causal=causal, deterministic=True if how == "argument" else None)
        return torch.autograd.grad(out, (q, k, v), g)

    if how == "torch":
        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    first = grads()
    for a, b in zip(first, grads()):
        assert torch.equal(a, b)
    assert set(launched) == {"_BWD_DQ"}


@pytest.mark.parametrize("causal", [False, True])
def test_one_pass_backward(device, causal, monkeypatch, fresh_caches):
    """The one-pass backward (the dk/dv kernel adds dq up in fp32, a row pass converts it; no dq kernel),
    where launch_bwd.ONE_PASS makes it the default of calls that allow it: dk and dv bitwise equal to the
    two-kernel backward's (the same dots), dq within a few ulps of its dq. Not with deterministic=True, nor
    above head_dim 128 (ValueError where asked for)."""
    from diyflash.kernels.attention import launch as ka, launch_bwd

    launched = _spy_dq_launchers(monkeypatch)
    q, k, v = make_qkv(2, 2, 77, 90, 32, torch.float16, device, requires_grad=True)
    g = random_like(q)
    det = torch.autograd.grad(torch.ops.diyflash.attention(q, k, v, causal=causal), (q, k, v), g)
    assert set(launched) == {"_BWD_DQ"}  # D32 and 90 keys: not a ONE_PASS cell, the two-kernel backward runs
    launched.clear()
    monkeypatch.setattr(launch_bwd, "ONE_PASS", {pad: (0, None) for pad in (16, 32, 64, 128)})  # every call
    out = torch.ops.diyflash.attention(q, k, v, causal=causal)
    first = torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), g)
    assert set(launched) == {"_BWD_DQ_CONVERT"}
    assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])
    torch.testing.assert_close(first[0], det[0], rtol=2e-3, atol=2e-3)
    assert torch.equal(first[1], det[1]) and torch.equal(first[2], det[2])
    out, lse = ka.attention_fwd(q.detach(), k.detach(), v.detach(), causal, 0.25, None)
    with pytest.raises(ValueError, match="cannot be deterministic"):
        ka.attention_bwd(out, None, q, k, v, out, lse, causal, 0.25, None, deterministic=True, one_pass=True)
    if ON_GPU:  # the tiles' TMA path adds each tile with one bulk reduce: a padded head_dim, tails, seq_lens
        from diyflash.kernels.attention_configs import AttnConfig, BwdConfig, bwd_config

        q2, k2, v2 = make_qkv(2, 3, 113, 70, 80, torch.bfloat16, device)
        lens = torch.tensor([70, 31], dtype=torch.int32, device=device)
        out2, lse2 = ka.attention_fwd(q2, k2, v2, causal, 80 ** -0.5, lens)
        dout2 = random_like(out2)
        tuned = bwd_config(128, q2.dtype, q2.device, causal, False)
        for tiles in (AttnConfig(64, 64, 4, 3, tma=True), AttnConfig(64, 64, 4, 3)):
            args = (dout2, None, q2, k2, v2, out2, lse2, causal, 80 ** -0.5, lens)
            two = ka.attention_bwd(*args, config=BwdConfig(tiles, tuned.dq))
            one = ka.attention_bwd(*args, config=BwdConfig(tiles, tuned.dq), deterministic=False, one_pass=True)
            torch.testing.assert_close(one[0], two[0], rtol=1e-2, atol=1e-2)
            assert torch.equal(one[1], two[1]) and torch.equal(one[2], two[2]), tiles
    wide = make_qkv(1, 1, 9, 9, 160, torch.float16, device)
    out, lse = ka.attention_fwd(*wide, causal, 0.25, None)
    with pytest.raises(ValueError, match="head_dim <= 128 only, got a padded 256"):
        ka.attention_bwd(out, None, *wide, out, lse, causal, 0.25, None, deterministic=False, one_pass=True)


@pytest.mark.parametrize("causal", [False, True])
def test_split_dkdv_passes_match_one_pass(device, causal):
    """The split backward (a dv pass, then a dk pass: head_dim 256's tiles) gives the one-pass dk and
    dv bit for bit, with padding keys (seq_lens), a padded head_dim and n_q != n_k; also where the dv
    pass has tiles of its own."""
    from dataclasses import replace

    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import AttnConfig, BwdConfig, bwd_config

    q, k, v = make_qkv(2, 2, 45, 70, 24, torch.float16, device)
    seq_lens = torch.tensor([70, 31], dtype=torch.int32, device=device)
    scale = 24 ** -0.5
    out, lse = ka.attention_fwd(q, k, v, causal, scale, seq_lens)
    dout = random_like(out)
    tuned = bwd_config(32, q.dtype, q.device, causal, ka.INTERPRETED)
    grads = [
        ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, seq_lens,
                         config=BwdConfig(replace(tuned.dkdv, split=split), tuned.dq))
        for split in (False, True)
    ]
    for one_pass, split in zip(*grads):
        assert torch.equal(one_pass, split)
    assert grads[1][1].abs().sum() > 0 and grads[1][2].abs().sum() > 0  # both passes wrote

    # the dv pass on tiles of its own (BwdConfig.dv): its dv is the one-pass dv of those tiles, and dk
    # is still the dk/dv tiles' dk
    dv_tiles = AttnConfig(16, 64, 4, 1)
    own = ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, seq_lens,
                           config=BwdConfig(replace(tuned.dkdv, split=True), tuned.dq, dv_tiles))
    dv_one_pass = ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, seq_lens,
                                   config=BwdConfig(dv_tiles, tuned.dq))[2]
    assert torch.equal(own[0], grads[0][0]) and torch.equal(own[1], grads[0][1])
    assert torch.equal(own[2], dv_one_pass)


def test_empty_inputs(device):
    for shapes in ((0, 2, 16, 16), (2, 2, 0, 16)):
        q, k, v = (torch.empty(shapes, device=device, dtype=torch.float16, requires_grad=True) for _ in range(3))
        out = torch.ops.diyflash.attention(q, k, v)
        assert out.shape == q.shape
        out.sum().backward()
        assert q.grad.shape == q.shape
    # no keys at all: every row sees nothing, so outputs 0 (not NaN)
    q = torch.randn(1, 2, 5, 16, device=device)
    k = v = torch.randn(1, 2, 0, 16, device=device)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, False, None, None)
    assert (out == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("causal", [False, True])
def test_pytorch_path_matches_oracle(torch_path, causal):
    """The PyTorch blocked implementation (CPU without the interpreter) follows the same semantics."""
    q, k, v = make_qkv(2, 2, 150, 131, 24, torch.float32, torch_path, layout="bnhd", requires_grad=True)
    seq_lens = torch.tensor([131, 77], dtype=torch.int32)
    check_attention(q, k, v, causal, seq_lens=seq_lens)


@pytest.mark.skipif(not ON_GPU, reason="large shapes need the GPU suite (the interpreter would take hours)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k,head_dim", [(4224, 4224, 256), (4224, 4224, 64), (1023, 4224, 128), (4224, 1023, 80)])
def test_large_gpu(device, dtype, causal, n_q, n_k, head_dim):
    q, k, v = make_qkv(1, 2, n_q, n_k, head_dim, dtype, device, requires_grad=True)
    check_attention(q, k, v, causal)


def _huge_scores(dtype, device, causal):
    """q, k, v (1, 2, 40, 64) with entries of 3e19 in a few rows and keys: their raw q.k (9e38) passes
    fp32's range while the scaled score (x 1/8: 1.1e38) does not. SDPA's math backend, which scales
    before its matmul, stays finite there; so must we."""
    q, k, v = make_qkv(1, 2, 40, 40, 64, torch.float32, "cpu")
    q[:, :, 30, 0] = 3e19  # row 30 sees key 5 at +1.1e38 and key 2 at -1.1e38
    q[:, 1, 33, 0] = -3e19
    k[:, :, 5, 0] = 3e19
    k[:, :, 2, 0] = -3e19
    k[:, 0, 20, 0] = 2e19
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def _check_huge_scores(q, k, v, causal):
    """Forward and backward are finite. out meets the error rule against plain PyTorch in SDPA's order
    (q / 8 first: exact at head_dim 64, so the plain reference carries only its own rounding). The
    gradients meet it with the rounding band at the scale of their terms: FlashAttention's ds = p (dp -
    delta) cancels two fp32 sums of ~|dp| in different orders (plain autograd's softmax cancels exactly
    where p is one-hot), and dq = scale * ds k, dk = scale * ds^T q carry that ~1e-7 |dp| times |k| or |q|
    (3e19 here)."""
    from diyflash.utils.validation import compare_with_oracle

    def reference(q, k, v, upcast):
        if upcast:
            return attention_ref(q, k, v, causal=causal, upcast=True)[0]
        return attention_ref(q * 0.125, k, v, causal=causal, scale=1.0, upcast=False)[0]

    gen = torch.Generator(device="cpu").manual_seed(1)
    dout = torch.randn(q.shape, generator=gen).to(q.device, q.dtype)
    out, grads, reports = compare_with_oracle(
        lambda q, k, v: torch.ops.diyflash.attention(q, k, v, causal=causal), reference, (q, k, v), "out",
        ("dq", "dk", "dv"), dout=dout)
    assert torch.isfinite(out).all()
    for g in grads:
        assert torch.isfinite(g).all()
    assert reports[0].ok, str(reports[0])
    terms = cancellation_bands(q, k, v, dout, 0.125)
    for report in reports[1:]:
        bound = report.bound + terms[report.name]
        assert report.err <= bound, f"{report} (term band {bound:.3e})"


@pytest.fixture(params=["one prescaled pass", "two passes"])
def forward_passes(request, monkeypatch):
    """Both of the bf16/fp32 forward's ways (launch.overflow_passes): small calls run one pass on the
    prescaled q; "two passes" makes these small calls run the raw pass and the rescue pass as large ones do."""
    from diyflash.kernels.attention import launch

    diyflash.clear_caches()  # (plans of the other way would replay)
    if request.param == "two passes":
        monkeypatch.setattr(launch, "PRESCALED_MAX_WORK", 0)
    yield request.param
    diyflash.clear_caches()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_raw_dot_past_fp32_range_stays_finite(device, dtype, causal, forward_passes):
    """Issue 23, item 9: the kernels multiply the operand they hold (q; k in the dk/dv kernel) by the
    power of two of the scale (semantics._prescaled), so q.k overflows only where the scaled score does
    (the forward only in the blocks whose raw q.k overflowed: launch.overflow_passes).
    It used to be NaN from the first overflowing q.k."""
    _check_huge_scores(*_huge_scores(dtype, device, causal), causal)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_prescaled_pass_gives_the_bits_of_two(device, dtype, monkeypatch):
    """The prescale is exact (powers of two), so where no raw q.k overflows the small call's one prescaled
    pass writes the bits the raw first pass writes (launch.overflow_passes)."""
    from diyflash.kernels.attention import launch

    q, k, v = (t.to(dtype) for t in make_qkv(2, 3, 113, 77, 64, torch.float32, device))
    diyflash.clear_caches()
    one = torch.ops.diyflash.attention_fwd(q, k, v, True, 0.3, None)
    monkeypatch.setattr(launch, "PRESCALED_MAX_WORK", 0)
    diyflash.clear_caches()
    two = torch.ops.diyflash.attention_fwd(q, k, v, True, 0.3, None)
    diyflash.clear_caches()
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.mark.parametrize("packed", [False, True])
def test_second_pass_chunks_give_the_bits_of_a_block_a_program(device, packed, monkeypatch):
    """The second pass checks launch.MARKED_PASS_ROWS rows a program and computes their marked blocks one after
    the other. bf16 rows whose raw q.k leaves fp32's range in the first, a middle and the last block of a head
    (and, packed, in three sequences whose rows start inside a chunk): whatever the chunk (a block, a few
    blocks, the whole head), the two passes write the bits of a block a program. They agree with the one
    prescaled pass (launch.overflow_passes) within bf16's rounding, not to the bit: on the GPU the second pass
    runs its own warps and no lazy rescaling (launch._RESCUE_META)."""
    from diyflash.kernels.attention import launch

    n = 300
    q, k, v = (t.to(torch.bfloat16) for t in make_qkv(1, 2, n, n, 64, torch.float32, device))
    q[:, :, [3, 150, 299], 0] = 3e19  # raw q.k past 3.4e38 against the keys below
    k[:, :, [1, 140], 0] = 3e19
    if packed:
        cu = torch.tensor([0, 97, 230, n], dtype=torch.int32, device=device)
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))  # (T, H, D)

        def call():
            return diyflash.flash_attention_varlen(q, k, v, cu, cu, 133, 133, causal=True, return_lse=True)
    else:
        def call():
            return diyflash.flash_attention(q, k, v, causal=True, return_lse=True)

    diyflash.clear_caches()
    one = call()
    assert torch.isfinite(one[0]).all()
    monkeypatch.setattr(launch, "PRESCALED_MAX_WORK", 0)
    block = None
    for rows in (1, 128, 4096):  # 1: a block a program (launch.attention_fwd takes at least the block's rows)
        monkeypatch.setattr(launch, "MARKED_PASS_ROWS", rows)
        diyflash.clear_caches()
        two = call()
        block = block or two
        assert torch.equal(two[0], block[0]) and torch.equal(two[1], block[1]), rows
    torch.testing.assert_close(block[0], one[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(block[1], one[1], atol=1e-4, rtol=1e-5)
    diyflash.clear_caches()


@pytest.mark.parametrize("causal", [False, True])
def test_rows_whose_every_raw_dot_overflows_negative(device, causal, forward_passes):
    """Row 10's raw q.k is -9e38 against every key (past fp32's range, scaled -1.1e38 within it): the raw
    dots are all -inf, which alone looks like a row that sees no key (output 0). The forward must notice
    (no finite max in a row with keys) and run that block on the prescaled q: out is then the average of
    the visible values, as SDPA's math backend gives. (Forward only: the backward's ds cancels terms of
    |k| = 3e19 for every key here, past the rounding band _check_huge_scores allows; it did so before the
    forward's second pass too.)"""
    from diyflash.utils.validation import compare_with_oracle

    q, k, v = make_qkv(1, 2, 24, 24, 64, torch.float32, "cpu")
    q[:, :, 10, 0] = 3e19
    k[:, :, :, 0] = -3e19
    q, k, v = (t.to(device=device, dtype=torch.bfloat16) for t in (q, k, v))
    out, _, (report,) = compare_with_oracle(
        lambda q, k, v: torch.ops.diyflash.attention(q, k, v, causal=causal),
        lambda q, k, v, upcast: attention_ref(q if upcast else q * 0.125, k, v, causal=causal,
                                              scale=None if upcast else 1.0, upcast=upcast)[0],
        (q, k, v), "out", (), grad=False)
    assert torch.isfinite(out).all() and report.ok, str(report)
    seen = 11 if causal else 24
    torch.testing.assert_close(out[0, :, 10].float(), v[0, :, :seen].float().mean(1), atol=2e-2, rtol=0)


@pytest.mark.parametrize("tiny", ["q", "k"])
def test_fp16_tiny_operand_keeps_its_bits(device, tiny):
    """fp16 q (or k) of ~0.02 against k (or q) of ~1.5e4, scale 2^-12: scores of O(1). Prescaling the operand
    a kernel holds by the power of two of the scale (semantics._prescaled, 2^-12 here: needed where a raw q.k
    can leave fp32's range, bf16 and fp32) makes ~0.02 subnormal in fp16 (< 6.1e-5) and cuts it to a few bits;
    the dk/dv kernel holds k and the dq kernel q, and with the prescale dq (tiny q: 1.3x the bound) or dk and
    dv (tiny k: 1.2x, 1.4x) missed the 2x rule (interpreter). fp16 cannot overflow, and every fp16
    kernel dots its operands as they are."""
    from diyflash.utils.validation import compare_with_oracle

    q, k, v = make_qkv(1, 2, 70, 70, 64, torch.float32, "cpu")
    small, big = (q, k) if tiny == "q" else (k, q)
    small *= 0.02
    big *= 1.5e4  # |k| < 6.6e4: still finite in fp16
    q, k, v = (t.to(device=device, dtype=torch.float16) for t in (q, k, v))
    assert all(torch.isfinite(t).all() for t in (q, k, v))
    scale = 2.0 ** -12
    _, _, reports = compare_with_oracle(
        lambda q, k, v: torch.ops.diyflash.attention(q, k, v, causal=True, scale=scale),
        lambda q, k, v, upcast: attention_ref(q, k, v, causal=True, scale=scale, upcast=upcast)[0],
        (q, k, v), "out", ("dq", "dk", "dv"))
    for report in reports:
        assert report.ok, str(report)


@pytest.mark.parametrize("causal", [False, True])
def test_raw_dot_past_fp32_range_stays_finite_on_the_pytorch_path(torch_path, causal):
    _check_huge_scores(*_huge_scores(torch.float32, torch_path, causal), causal)


@pytest.mark.skipif(not ON_GPU, reason="the peer is SDPA's flash backend, CUDA only; the interpreter never contracts "
                    "the scale into an FMA (the CPU side is test_raw_dot_past_fp32_range_stays_finite)")
@pytest.mark.parametrize("m", [1e3, 1e5, 1e6, 1e9])
def test_huge_scores_as_exact_as_sdpa_flash(device, m):
    """Issue 23, item 9: scores of ~m^2/8 (1e5 .. 1e17). The compiled forward used to fold the scale into
    the exponent's FMA, whose rounding against the row max overflowed p: NaN from ~1e11, gradients off by
    1e18 at 1e9. Every kernel now rounds the scaled score on its own (semantics._mul_exact) and the backward
    caps p at 1 (semantics._probs). Out and the gradients must be finite and within 2x the error of SDPA's
    FlashAttention-2 backend in the same precision (bf16), plus a bf16 rounding band of the reference.
    Inputs: bench.huge_scores's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.huge_scores import inputs

    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = inputs(m, torch.bfloat16, device, gen)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = attention_ref(*leaves, causal=True)[0]
    dout = torch.randn(ref.shape, generator=gen).to(device)
    want = (ref, *torch.autograd.grad(ref, leaves, dout))

    def errors(fn):
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*ins)
        got = (out, *torch.autograd.grad(out, ins, dout.to(out.dtype)))
        return [(g.double() - w).abs().max().item() for g, w in zip(got, want)]

    ours = errors(lambda q, k, v: torch.ops.diyflash.attention(q, k, v, causal=True))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        peer = errors(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    for name, a, b, w in zip(("out", "dq", "dk", "dv"), ours, peer, want):
        band = 2 * torch.finfo(torch.bfloat16).eps * w.abs().max().item()
        assert a <= 2 * b + band, f"{name}: err {a:.3e} > 2 x sdpa-flash {b:.3e} + {band:.3e} (m = {m:g})"


def test_prescale_keeps_the_bits(device):
    """The prescale is exact: scaling q by 2^-4 and the scale by 2^4 gives the same q the kernel dots
    (the same bits out), and a scale >= 1 is not prescaled (q is never scaled up)."""
    q, k, v = make_qkv(1, 2, 33, 47, 64, torch.float16, device)
    for scale in (0.125, 0.3, 2.5):
        a = torch.ops.diyflash.attention(q, k, v, scale=scale)
        b = torch.ops.diyflash.attention(q * 2.0**-4, k, v, scale=scale * 16)
        if scale < 1:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, atol=2e-3, rtol=0)
