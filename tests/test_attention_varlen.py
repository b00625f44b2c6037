"""Packed sequences (issue 25): diyflash.flash_attention_varlen and diyflash::attention_varlen against the
per-sequence float64 oracle (diyflash.reference.attention_varlen_ref) with the 2x-plain-PyTorch rule on
out, lse, dq, dk, dv and dsinks; self- and cross-attention lengths with 0- and 1-token sequences, GQA,
windows, softcap, ALiBi, sinks, packed and permuted strides; opcheck, compile (0 graph breaks), export,
autocast, determinism, errors. The same file runs on CPU (Triton's interpreter) and on CUDA.
"""

import pytest
import torch

import diyflash
from diyflash.reference import attention_varlen_ref
from helpers import ON_GPU, check_varlen, copies_of, cu, opcheck_backward, packed, sink_logits, slopes


SELF = [17, 1, 0, 113, 40]  # lengths 0 and 1, a partial block, several blocks
CROSS = ([5, 0, 17, 1, 33], [7, 3, 17, 0, 60])  # N_q != N_k per sequence, empty queries, empty keys


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", ["self", "cross"])
@pytest.mark.parametrize("h,h_kv", [(4, 4), (4, 1), (8, 2)])
def test_varlen(device, causal, lens, h, h_kv):
    lens_q, lens_k = (SELF, SELF) if lens == "self" else CROSS
    q, k, v = packed(lens_q, lens_k, h, h_kv, 16, device=device)
    check_varlen(q, k, v, lens_q, lens_k, causal)


@pytest.mark.parametrize("window", [(8, -1), (4, 4), (0, 0), (-1, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_window(device, window, causal):
    q, k, v = packed(*CROSS, 4, 2, 16, device=device)
    check_varlen(q, k, v, *CROSS, causal, window=window)


@pytest.mark.parametrize("layout", ["qkv", "htd"])
def test_varlen_strides_read_in_place(device, layout):
    q, k, v = packed(SELF, SELF, 4, 2, 16, device=device, layout=layout)
    assert not q.is_contiguous()
    check_varlen(q, k, v, SELF, SELF, True)
    cu_q = cu(SELF, device)
    fn = lambda: diyflash.flash_attention_varlen(q, k, v, cu_q, cu_q, 113, 113, True)  # noqa: E731
    assert not copies_of(fn, q, k, v)


def test_varlen_every_variant(device):
    lens_q, lens_k = CROSS
    q, k, v = packed(lens_q, lens_k, 4, 2, 16, 8, device=device, dtype=torch.float32)
    check_varlen(q, k, v, lens_q, lens_k, True, 0.3, window=(9, -1), softcap=2.0, alibi=slopes(4, len(lens_q), device),
          sinks=sink_logits(4, device))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_varlen_dtypes_head_dim_80(device, dtype):
    lens = [33, 1, 70]
    q, k, v = packed(lens, lens, 2, 1, 80, dtype=dtype, device=device)
    check_varlen(q, k, v, lens, lens, True, alibi=slopes(2, device=device), sinks=sink_logits(2, device))


def test_varlen_equals_dense_per_sequence(device):
    """Equal-length sequences: varlen gives what flash_attention gives on the (B, H, N, D) batch."""
    b, n, h = 3, 40, 4
    q, k, v = packed([n] * b, [n] * b, h, 2, 16, device=device, dtype=torch.float32)
    cu_q = cu([n] * b, device)
    out = diyflash.flash_attention_varlen(q, k, v, cu_q, cu_q, n, n, True, window_size=(7, -1))
    dense = lambda t: t.unflatten(0, (b, n)).transpose(1, 2)  # noqa: E731
    want = diyflash.flash_attention(dense(q), dense(k), dense(v), True, window_size=(7, -1))
    torch.testing.assert_close(out, want.transpose(1, 2).flatten(0, 1), rtol=1e-5, atol=1e-5)


def test_varlen_gradients_are_deterministic(device, monkeypatch, fresh_caches):
    """deterministic=True: bitwise equal gradients call after call; the one-pass backward (launch_bwd.ONE_PASS):
    dk and dv the same bits, dq within a few ulps of them."""
    from diyflash.kernels.attention import launch_bwd

    q, k, v = packed(SELF, SELF, 8, 2, 16, device=device)
    cu_q = cu(SELF, device)
    gen = torch.Generator(device="cpu").manual_seed(3)
    dout = torch.randn(q.shape, generator=gen).to(device, q.dtype)

    def grads(deterministic):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = diyflash.flash_attention_varlen(*leaves, cu_q, cu_q, 113, 113, True, deterministic=deterministic)
        return torch.autograd.grad(out, leaves, dout)

    first = grads(True)
    assert all(torch.equal(a, b) for a, b in zip(first, grads(True)))
    monkeypatch.setattr(launch_bwd, "ONE_PASS", {pad: (0, None) for pad in (16, 32, 64, 128)})  # every call
    default = grads(None)
    torch.testing.assert_close(default[0], first[0], rtol=2e-3, atol=2e-3)
    assert torch.equal(default[1], first[1]) and torch.equal(default[2], first[2])


@pytest.mark.parametrize("parts", [2, 4])
def test_varlen_gqa_backward_split_over_programs(device, monkeypatch, parts, fresh_caches):
    """Packed sequences through the split dk/dv kernel (see test_attention_variants'
    test_gqa_backward_split_over_programs): each sequence's programs write only their keys' partial
    sums, and the sum launch covers every packed key, lengths 0 and 1 included."""
    from diyflash.kernels.attention import launch_bwd

    monkeypatch.setattr(launch_bwd, "head_split", lambda *_, **__: parts)
    diyflash.clear_caches()  # a plan's split follows from its key, except under this patch
    q, k, v = packed(*CROSS, 8, 2, 16, device=device)
    check_varlen(q, k, v, *CROSS, True, window=(9, -1))


def test_pytorch_path_gradcheck_float64(torch_path):
    lens_q, lens_k = [3, 0, 5], [4, 2, 0]
    q, k, v = (t.requires_grad_() for t in packed(lens_q, lens_k, 4, 2, 8, dtype=torch.float64))
    sinks = sink_logits(4).double().requires_grad_()
    cu_q, cu_k = cu(lens_q, "cpu"), cu(lens_k, "cpu")

    def fn(q, k, v, s):
        return torch.ops.diyflash.attention_varlen_fwd(q, k, v, cu_q, cu_k, 5, 4, True, 0.4, 2, -1, 2.0,
                                                       slopes(4, 3).double(), s)

    assert torch.autograd.gradcheck(fn, (q, k, v, sinks), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_pytorch_path_matches_the_oracle(torch_path):
    lens_q, lens_k = CROSS
    q, k, v = packed(lens_q, lens_k, 6, 3, 16, 8, dtype=torch.float64)
    al, s = slopes(6, len(lens_q)).double(), sink_logits(6).double()
    cu_q, cu_k = cu(lens_q, "cpu"), cu(lens_k, "cpu")
    ours = torch.ops.diyflash.attention_varlen_fwd(q, k, v, cu_q, cu_k, 33, 60, False, None, 5, 2, 3.0, al, s)
    want = attention_varlen_ref(q, k, v, cu_q, cu_k, False, None, window_size=(5, 2), softcap=3.0, alibi_slopes=al,
                                sinks=s)
    for a, b in zip(ours, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---- the ops: opcheck, compile, export, autocast, errors --------------------------------------------


def _op_args(device, requires_grad=False, variants=True, dtype=torch.float32):
    lens_q, lens_k = [5, 0, 17], [7, 3, 17]
    q, k, v = (t.requires_grad_(requires_grad) for t in packed(lens_q, lens_k, 4, 2, 16, dtype=dtype, device=device))
    if not variants:
        return (q, k, v, cu(lens_q, device), cu(lens_k, device), 17, 17, True, None)
    s = sink_logits(4, device).requires_grad_(requires_grad)
    return (q, k, v, cu(lens_q, device), cu(lens_k, device), 17, 17, True, 0.5, 4, -1, 2.0, slopes(4, 3, device), s)


@pytest.mark.parametrize("variants", [False, True])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_varlen(device, requires_grad, variants):
    args = _op_args(device, requires_grad, variants)
    torch.library.opcheck(torch.ops.diyflash.attention_varlen.default, args, test_utils="ALL")
    torch.library.opcheck(torch.ops.diyflash.attention_varlen_fwd.default, args, test_utils="ALL")


def test_opcheck_varlen_bwd(device):
    opcheck_backward(torch.ops.diyflash.attention_varlen_fwd, torch.ops.diyflash.attention_varlen_bwd.default,
                     _op_args(device))


def test_compile_fullgraph_no_graph_breaks(device):
    """A training step over packed batches under torch.compile(fullgraph=True): 0 graph breaks, no host
    sync, max_seqlen as SymInts (one graph serves further batches), eager and compiled agree."""
    torch._dynamo.reset()
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    sinks = sink_logits(4, device).requires_grad_()

    def step(q, k, v, cu_q, cu_k, max_q, max_k):
        out = diyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, True, window_size=(16, -1),
                                              sinks=sinks)
        return out.float().square().sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend, dynamic=True)
    for lens in ([17, 1, 40], [30, 0, 9], [64, 3, 8]):
        q, k, v = (t.requires_grad_() for t in packed(lens, lens, 4, 2, 16, device=device))
        cu_q = cu(lens, device)
        loss = compiled(q, k, v, cu_q, cu_q, max(lens), max(lens))
        loss.backward()
        torch.testing.assert_close(loss, step(q.detach(), k.detach(), v.detach(), cu_q, cu_q, max(lens), max(lens)))
    assert len(frames) == 1, f"{len(frames)} graphs for 3 batches"
    lens = [17, 1, 40]
    explain = torch._dynamo.explain(step)(*packed(lens, lens, 4, 2, 16, device=device), cu(lens, device),
                                          cu(lens, device), 40, 40)
    assert explain.graph_break_count == 0


def test_export_round_trip(device, tmp_path):
    class M(torch.nn.Module):
        def forward(self, q, k, v, cu_q, cu_k):
            return diyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, 17, 17, True, window_size=(8, -1),
                                                   return_lse=True)

    m = M()
    args = _op_args(device, variants=False)[:5]
    ep = torch.export.export(m, args)
    assert "diyflash.attention_varlen_fwd" in str(ep.graph)
    path = tmp_path / "varlen.pt2"
    torch.export.save(ep, path)
    loaded = torch.export.load(path)
    for got, want in zip(loaded.module()(*args), m(*args)):
        torch.testing.assert_close(got, want)


def test_autocast(device):
    args = _op_args(device, variants=False)
    dtype = torch.bfloat16
    with torch.autocast(device.type, dtype=dtype):
        out, lse = diyflash.flash_attention_varlen(*args[:8], return_lse=True)
        compiled = torch.compile(lambda *a: torch.ops.diyflash.attention_varlen(*a), fullgraph=True)(*args)
    assert out.dtype == dtype and lse.dtype == torch.float32 and compiled.dtype == dtype
    want = diyflash.flash_attention_varlen(*(t.to(dtype) for t in args[:3]), *args[3:8])
    assert torch.equal(out, want) and torch.equal(compiled, want)


def _errors(device):
    q, k, v, cu_q, cu_k = _op_args(device, variants=False)[:5]
    i32 = dict(dtype=torch.int32, device=device)
    return [
        (dict(q=q.unsqueeze(0)), ValueError, "packed sequences need 3-D (total, heads, head_dim) tensors"),
        (dict(k=k[:, :1].expand(-1, 3, -1), v=v[:, :1].expand(-1, 3, -1)), ValueError,
         "number of query heads (4) must be a multiple of the number of kv heads (3)"),
        (dict(cu_q=cu_q.long()), TypeError, "cu_seqlens_q must be int32, got torch.int64"),
        (dict(cu_k=cu_k[:1]), ValueError, "cu_seqlens_k must have shape (B + 1,) with 1 <= B <= 65535, got (1,)"),
        (dict(cu_k=cu_k[:3]), ValueError, "must describe the same number of sequences"),
        (dict(cu_q=torch.tensor([0, 5, 3, 22], **i32)), ValueError,
         "cu_seqlens_q must be non-decreasing, got cu_seqlens_q[1] = 5 > cu_seqlens_q[2] = 3"),
        (dict(cu_q=torch.tensor([1, 5, 5, 22], **i32)), ValueError, "cu_seqlens_q[0] must be 0, got 1"),
        (dict(cu_k=torch.tensor([0, 7, 10, 20], **i32)), ValueError,
         "cu_seqlens_k[-1] must equal the number of tokens (27), got 20"),
        (dict(max_q=16), ValueError, "a sequence of cu_seqlens_q has 17 tokens, more than max_seqlen (16)"),
        (dict(max_k=-1), ValueError, "max_seqlen_k must be >= 0, got -1"),
        (dict(alibi_slopes=torch.ones(2, 4, device=device)), ValueError,
         "alibi_slopes must have shape (4,) or (3, 4), got (2, 4)"),
        (dict(window_size=(-3, 0)), ValueError, "window left must be -1 (unbounded) or >= 0, got -3"),
    ]


VALUE_ERRORS = (5, 6, 7, 8)  # the cases above about the values of cu_seqlens


@pytest.mark.parametrize("i", range(12))
def test_errors_name_the_values(device, i):
    q, k, v, cu_q, cu_k = _op_args(device, variants=False)[:5]
    kw, exc, phrase = _errors(device)[i]
    a = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=17, max_k=17)
    a.update({name: kw.pop(name) for name in list(a) if name in kw})
    with pytest.raises(exc) as api:
        diyflash.flash_attention_varlen(a["q"], a["k"], a["v"], a["cu_q"], a["cu_k"], a["max_q"], a["max_k"], True,
                                        validate="sync", **kw)
    assert phrase in str(api.value)
    if i in VALUE_ERRORS:
        return  # values: the API checks them (validate); the op never reads them on the host (the kernels clamp)
    window = kw.pop("window_size", (-1, -1))
    op_args = (a["q"], a["k"], a["v"], a["cu_q"], a["cu_k"], a["max_q"], a["max_k"], True, None, *window, 0.0,
               kw.get("alibi_slopes"), None)
    with pytest.raises(exc) as op:
        torch.ops.diyflash.attention_varlen_fwd(*op_args)
    assert phrase in str(op.value) and "diyflash::attention_varlen_fwd" in str(op.value)
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(exc):
            torch.ops.diyflash.attention_varlen_fwd(*op_args)


def test_bad_offsets_never_read_out_of_bounds(device):
    """Unchecked values (as while compiling): offsets past the tensors are clamped by the kernels, so a
    call finishes with finite output rows for every in-range token and reads nothing outside."""
    q, k, v, cu_q, _ = _op_args(device, variants=False)[:5]
    bad_k = torch.tensor([0, 7, 1000, 2**30], dtype=torch.int32, device=device)
    out = torch.ops.diyflash.attention_varlen(q, k, v, cu_q, bad_k, 17, 17, True)
    assert torch.isfinite(out).all()


@pytest.mark.skipif(not ON_GPU, reason="a long packed batch: GPU only (the interpreter would take minutes)")
def test_varlen_long_documents_gpu(device):
    lens = [1023, 4096, 1, 2900, 0, 517]
    q, k, v = packed(lens, lens, 8, 2, 128, dtype=torch.bfloat16, device=device)
    check_varlen(q, k, v, lens, lens, True)
