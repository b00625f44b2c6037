"""The dense ops' diagonal_offset (contract.band): query row i sits at key position i + N_k - N_q + offset,
so causal masks and windows move with it (ring attention draws a window of the whole sequence on each
pair of chunks with it). Against the float64 oracle under the 2x rule (out, lse, dq, dk, dv, dsinks), on
the interpreter and the PyTorch path (CPU) and on CUDA; opcheck ALL, compile, export, and the errors."""

import pytest
import torch

from diyflash.reference import attention_ref
from diyflash.utils.validation import compare_with_oracle
from helpers import ON_GPU, opcheck_backward, sink_logits, slopes
from test_attention_variants import _finite, make

fwd = torch.ops.diyflash.attention_fwd

CASES = [
    # (h, h_kv, n_q, n_k, d, dv, causal, window, softcap, sinks, offset)
    (4, 2, 17, 17, 16, 16, True, (-1, -1), 0.0, False, 9),  # causal, keys from the future: more keys than usual
    (4, 2, 17, 17, 16, 16, True, (-1, -1), 0.0, False, -9),  # fewer: the first 9 rows see none
    (4, 1, 113, 47, 16, 16, False, (6, 3), 0.0, False, 40),
    (4, 1, 33, 113, 16, 8, True, (20, -1), 3.0, True, -70),  # a ring pair's band: window past the chunk
    (8, 2, 113, 113, 80, 80, False, (-1, 5), 0.0, True, -113),  # head_dim 80, GQA 4
    (8, 1, 1, 1023, 16, 16, True, (100, -1), 0.0, False, -500),  # one row: the dense kernel, not the decode one
    (3, 3, 17, 113, 16, 16, False, (0, 0), 0.0, False, 1000),  # no row sees a key
    (2, 2, 0, 9, 16, 16, True, (4, -1), 0.0, False, 3),
    (2, 2, 9, 0, 16, 16, False, (4, 4), 0.0, False, -3),
]


def _args(case, device, dtype, layout="bhnd"):
    h, h_kv, n_q, n_k, d, dv, causal, window, softcap, sinks, offset = case
    q, k, v = make(2, h, h_kv, n_q, n_k, d, dv, dtype=dtype, device=device, layout=layout)
    s = sink_logits(h, device) if sinks else None
    return q, k, v, causal, window, softcap, s, offset


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else []))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_against_the_oracle(device, case, dtype):
    q, k, v, causal, window, softcap, sinks, offset = _args(CASES[case], device, dtype, "bnhd" if case % 2 else "bhnd")
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    names = ("dq", "dk", "dv", "dsinks")[:len(inputs)]

    def ours(q, k, v, s=None):
        return fwd(q, k, v, causal, None, None, *window, softcap, None, s, offset)

    def ref(q, k, v, s=None, upcast=True):
        return attention_ref(q, k, v, causal, None, None, upcast, window_size=window, softcap=softcap, sinks=s,
                             diagonal_offset=offset)

    _, _, reports = compare_with_oracle(lambda *t: ours(*t)[0], lambda *t, upcast: ref(*t, upcast=upcast)[0],
                                        inputs, "out", names)
    lse_inputs = inputs[:2] + inputs[3:]  # a loss on lse alone reaches q, k and sinks through dlse
    _, _, more = compare_with_oracle(
        lambda q, k, *s: _finite(ours(q, k, v.to(q.dtype), *s)[1]),
        lambda q, k, *s, upcast: _finite(ref(q, k, v.to(q.dtype), *s, upcast=upcast)[1]),
        lse_inputs, "lse", tuple(f"{n} (via lse)" for n in ("dq", "dk", "dsinks")[:len(lse_inputs)]))
    for report in reports + more:
        assert report.ok, str(report)
    lse = ours(q, k, v, sinks)[1]
    want = ref(*(t.double() for t in (q, k, v)), None if sinks is None else sinks.double())[1]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want)), "rows with lse = -inf differ"


def test_pytorch_path(torch_path):
    """The PyTorch blocked implementation (CPU without the interpreter; float64 everywhere) folds the offset
    by the same contract.band: equal to the oracle to rounding."""
    for case in CASES:
        q, k, v, causal, window, softcap, sinks, offset = _args(case, torch_path, torch.float64)
        got = fwd(q, k, v, causal, None, None, *window, softcap, None, sinks, offset)
        want = attention_ref(q, k, v, causal, None, None, window_size=window, softcap=softcap, sinks=sinks,
                             diagonal_offset=offset)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_zero_offset_is_the_default(device):
    q, k, v = make(1, 4, 2, 40, 33, 16, device=device)
    for causal, window in ((True, (-1, -1)), (False, (5, 2))):
        plain = fwd(q, k, v, causal, None, None, *window, 0.0, None, None)
        given = fwd(q, k, v, causal, None, None, *window, 0.0, None, None, 0)
        assert all(torch.equal(a, b) for a, b in zip(plain, given))


def test_errors_name_the_values(device):
    q, k, v = make(1, 4, 4, 8, 8, 16, device=device)
    for offset in (2**31, -2**30 - 1):
        with pytest.raises(ValueError, match=rf"within \+-1073741824, got {offset}"):
            fwd(q, k, v, True, None, None, -1, -1, 0.0, None, None, offset)
    with pytest.raises(NotImplementedError, match="diagonal_offset=3 with alibi_slopes"):
        fwd(q, k, v, True, None, None, -1, -1, 0.0, slopes(4, None, device), None, 3)
    # ALiBi with the default offset still runs
    fwd(q, k, v, True, None, None, -1, -1, 0.0, slopes(4, None, device), None, 0)


def _op_args(device, requires_grad=False):
    q, k, v = make(2, 4, 2, 17, 23, 16, device=device)
    s = sink_logits(4, device)
    tensors = [t.requires_grad_(requires_grad) for t in (q, k, v, s)]
    return (*tensors[:3], True, None, None, 5, -1, 2.0, None, tensors[3], -11)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, requires_grad):
    args = _op_args(device, requires_grad)
    torch.library.opcheck(torch.ops.diyflash.attention.default, args, test_utils="ALL")
    torch.library.opcheck(fwd.default, args, test_utils="ALL")


def test_opcheck_bwd(device):
    opcheck_backward(fwd, torch.ops.diyflash.attention_bwd.default, _op_args(device))


def test_compile_and_export(device, tmp_path):
    """fullgraph compile with 0 graph breaks (out and gradients equal eager), and an exported program
    that keeps the offset."""
    torch._dynamo.reset()

    def step(q, k, v):
        out, lse = fwd(q, k, v, True, None, None, 7, -1, 0.0, None, None, -13)
        return out.float().square().sum() + torch.where(torch.isneginf(lse), 0.0, lse).sum()

    q, k, v = (t.requires_grad_() for t in make(1, 4, 2, 40, 40, 16, device=device))
    assert torch._dynamo.explain(step)(q, k, v).graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v)
    grads = torch.autograd.grad(got, (q, k, v))
    want = step(q, k, v)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(grads, torch.autograd.grad(want, (q, k, v))))

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.ops.diyflash.attention(q, k, v, causal=True, window_left=7, diagonal_offset=-13)

    ep = torch.export.export(M(), (q.detach(), k.detach(), v.detach()))
    assert "diagonal_offset = -13" in str(ep.graph) or "-13" in str(ep.graph)
    path = tmp_path / "offset.pt2"
    torch.export.save(ep, path)
    out = torch.export.load(path).module()(q.detach(), k.detach(), v.detach())
    assert torch.equal(out, M()(q.detach(), k.detach(), v.detach()))


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_mean_keys_counts_the_visible_keys(case, causal):
    """contract.mean_keys (hopper.AUTO_MIN_KEYS asks it) against the PyTorch path's mask: the keys a query
    row sees, averaged over the rows, under every band of CASES, its diagonal offset folded in or not."""
    from diyflash.kernels.attention_torch import _visible
    from diyflash.kernels.contract import band, mean_keys, variant

    _, _, n_q, n_k, *_, window, _, _, offset = CASES[case]
    for off in {0, offset}:
        var = variant(causal, window, 0.0, n_q, n_k, 1, 1, off)
        rows, cols = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        seen = _visible(rows, cols, n_q, n_k, var.causal, n_k - n_q, var.window, var.left, var.right)
        want = seen.sum().item() / n_q if n_q else 0.0
        assert mean_keys(var, n_q, n_k) == pytest.approx(want, abs=1e-9), band(causal, window, n_q, n_k, off)
        with torch.device("meta"):  # a default device never reaches it (on a GPU, .item() would sync)
            assert mean_keys(var, n_q, n_k) == pytest.approx(want, abs=1e-9)
