"""torch.library.opcheck(test_utils="ALL") for every attention op over a matrix of inputs, and
gradcheck in float64.

opcheck runs each op ~10 times (schema, autograd registration, fake tensor strides, AOT dispatch
static and dynamic); on CPU that is the Triton interpreter, so shapes stay tiny.
"""

import re

import pytest
import torch

import diyflash  # noqa: F401
from helpers import ON_GPU, make_qkv, random_like

# (n_q, n_k, head_dim, layout, causal, scale, dtype, with seq_lens)
CASES = [
    (17, 17, 16, "bhnd", False, None, torch.float32, False),
    (17, 17, 16, "bhnd", True, 0.3, torch.float16, False),
    (5, 17, 24, "bnhd", True, None, torch.float32, False),
    (17, 5, 16, "bnhd", True, None, torch.float16, False),
    (1, 1, 8, "3d", False, 0.5, torch.float32, False),
    (13, 13, 16, "sliced", False, None, torch.float16, True),
    (9, 20, 16, "bhnd", True, None, torch.bfloat16, True),
]
IDS = [f"{c[0]}x{c[1]}-d{c[2]}-{c[3]}-causal{int(c[4])}-scale{c[5]}-{str(c[6])[6:]}-sl{int(c[7])}" for c in CASES]


def _seq_lens(q, n_k, with_seq_lens):
    if not with_seq_lens:
        return None
    b = q.shape[0]
    return torch.tensor([max(1, n_k - 3 * i) for i in range(b)], dtype=torch.int32, device=q.device)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_opcheck_attention(device, case, requires_grad):
    n_q, n_k, d, layout, causal, scale, dtype, with_sl = case
    q, k, v = make_qkv(2, 2, n_q, n_k, d, dtype, device, layout=layout, requires_grad=requires_grad)
    seq_lens = _seq_lens(q, n_k, with_sl)
    torch.library.opcheck(torch.ops.diyflash.attention.default, (q, k, v, causal, scale, seq_lens), test_utils="ALL")
    torch.library.opcheck(torch.ops.diyflash.attention_fwd.default, (q, k, v, causal, scale, seq_lens), test_utils="ALL")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_opcheck_attention_bwd(device, case):
    n_q, n_k, d, layout, causal, scale, dtype, with_sl = case
    q, k, v = make_qkv(2, 2, n_q, n_k, d, dtype, device, layout=layout)
    seq_lens = _seq_lens(q, n_k, with_sl)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, causal, scale, seq_lens)
    dout = random_like(out)
    for dlse in (None, random_like(lse)):
        args = (dout, dlse, q, k, v, out, lse, causal, scale, seq_lens)
        torch.library.opcheck(torch.ops.diyflash.attention_bwd.default, args, test_utils="ALL")


def test_opcheck_zero_stride_grad(device):
    q, k, v = make_qkv(1, 2, 11, 11, 16, torch.float32, device)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, True, None, None)
    dout = torch.ones((), device=device).expand_as(out)  # what out.sum().backward() sends
    args = (dout, None, q, k, v, out, lse, True, None, None)
    torch.library.opcheck(torch.ops.diyflash.attention_bwd.default, args, test_utils="ALL")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(6, 6), (3, 7), (7, 3)])
def test_gradcheck_float64(causal, n_q, n_k):
    """float64 takes the PyTorch path on any device; gradcheck also covers the lse output."""
    q, k, v = make_qkv(1, 2, n_q, n_k, 8, torch.float64, "cpu", requires_grad=True)
    seq_lens = torch.tensor([max(2, min(n_q, n_k) - 1)], dtype=torch.int32)

    def fn(q, k, v):
        out, lse = torch.ops.diyflash.attention_fwd(q, k, v, causal, None, seq_lens)
        return out, torch.where(torch.isneginf(lse), 0.0, lse)  # rows that see no key: lse = -inf

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)
    # one output alone: the other's gradient arrives as None (not materialized as zeros)
    for i in (0, 1):
        assert torch.autograd.gradcheck(lambda q, k, v: fn(q, k, v)[i], (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradcheck(lambda q, k, v: torch.ops.diyflash.attention(q, k, v, causal), (q, k, v))


@pytest.mark.skipif(not ON_GPU, reason="CUDA float64 path: GPU suite only")
def test_gradcheck_float64_cuda(device):
    q, k, v = make_qkv(1, 2, 5, 7, 8, torch.float64, device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: torch.ops.diyflash.attention(q, k, v, True), (q, k, v))


def test_unused_lse_gradient_is_not_materialized(device):
    """out.sum().backward() passes dlse=None to attention_bwd, not a zero tensor to fill and read."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.diyflash.attention_bwd.default:
                seen.append(args[1])
            return func(*args, **(kwargs or {}))

    q, k, v = make_qkv(1, 2, 9, 9, 16, torch.float32, device, requires_grad=True)
    with Record():
        torch.ops.diyflash.attention(q, k, v).sum().backward()
    assert seen == [None]


@pytest.mark.parametrize("case, exc, phrase", [
    ("k head_dim", ValueError, "q and k must have the same head_dim"),
    ("v length", ValueError, "v must have k's batch, heads and length"),
    ("dtype", TypeError, "dtypes must match, got q torch.float32, k torch.float16"),
    ("rank", ValueError, "Expected 3D or 4D tensors of the same rank"),
    ("seq_lens", ValueError, "seq_lens must have shape (batch,) = (2,), got (3,)"),
    ("device", ValueError, "inputs must be on one device, got q on {device}, k on meta, v on {device}"),
    # issue 23: each of these was computed (int, bool, complex truncated), crashed inside a kernel, or
    # read a meta seq_lens' uninitialised memory as lengths
    ("int dtype", TypeError, "Unsupported dtype torch.int32 for q"),
    ("bool dtype", TypeError, "Unsupported dtype torch.bool for q"),
    ("complex dtype", TypeError, "Unsupported dtype torch.complex64 for q"),
    ("fp8 dtype", TypeError, "Unsupported dtype torch.float8_e4m3fn for q"),
    ("head_dim 0", ValueError, "Unsupported head_dim 0"),
    ("head_dim 12", ValueError, "Unsupported head_dim 12"),
    ("head_dim 512", ValueError, "Unsupported head_dim 512"),
    ("seq_lens meta", ValueError, "seq_lens must be on the inputs' device {device} (or on the CPU beside CUDA inputs), got meta"),
    ("seq_lens float", TypeError, "seq_lens must be int32 (or int64), got torch.float32"),
])
def test_ops_check_their_inputs(device, case, exc, phrase):
    """Called by name (no API checks), the ops still say what is wrong instead of computing a silently
    wrong answer, eagerly and at trace time (their fakes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = make_qkv(2, 2, 8, 8, 16, torch.float32, device)
    seq_lens = None
    if case == "k head_dim":
        k, v = (torch.cat([t, t], -1) for t in (k, v))
    elif case == "v length":
        v = v[:, :, :5]
    elif case == "dtype":
        k = k.half()
    elif case == "rank":
        k = k[0]
    elif case == "device":
        k = k.to("meta")
        phrase = phrase.format(device=q.device)
    elif case.endswith(" dtype"):
        dtype = {"int": torch.int32, "bool": torch.bool, "complex": torch.complex64, "fp8": torch.float8_e4m3fn}[case.split()[0]]
        q, k, v = (t.to(dtype) for t in (q, k, v))
    elif case.startswith("head_dim"):
        d = int(case.split()[1])
        q, k, v = (torch.zeros(2, 2, 8, d, device=device) for _ in range(3))
    elif case == "seq_lens meta":
        seq_lens = torch.tensor([8, 8], dtype=torch.int32, device="meta")
        phrase = phrase.format(device=q.device)
    elif case == "seq_lens float":
        seq_lens = torch.tensor([8.0, 8.0], device=device)
    else:
        seq_lens = torch.tensor([8, 8, 8], dtype=torch.int32, device=device)
    with pytest.raises(exc, match=re.escape(phrase)):
        torch.ops.diyflash.attention_fwd(q, k, v, False, None, seq_lens)
    if case == "seq_lens meta":  # the backward op too
        out, lse = torch.ops.diyflash.attention_fwd(q, k, v, False, None, None)
        with pytest.raises(exc, match=re.escape(phrase)):
            torch.ops.diyflash.attention_bwd(out, None, q, k, v, out, lse, False, None, seq_lens)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, pytest.raises(exc, match=re.escape(phrase)):
        fake = [mode.from_tensor(t) if t is not None else None for t in (q, k, v, seq_lens)]
        torch.ops.diyflash.attention_fwd(fake[0], fake[1], fake[2], False, None, fake[3])


def test_matmul_op_checks_its_dtype(device):
    for dtype in (torch.int64, torch.bool, torch.complex64):
        a = torch.ones(4, 8, device=device).to(dtype)
        with pytest.raises(TypeError, match=re.escape(f"Unsupported dtype {dtype} for a")):
            torch.ops.diyflash.matmul(a, a.mT)


def test_int64_seq_lens_beyond_int32_are_clamped_not_wrapped(device):
    """2^32 + 3 had been converted to int32 and read as 3. The op reads no value on the host (no sync): it
    clamps into int32, and the kernels clamp that to N, as any length past N; the API refuses it."""
    q, k, v = make_qkv(2, 2, 8, 8, 16, torch.float32, device)
    seq_lens = torch.tensor([2**32 + 3, 8], dtype=torch.int64, device=device)
    full = torch.tensor([8, 8], dtype=torch.int32, device=device)
    torch.testing.assert_close(torch.ops.diyflash.attention(q, k, v, seq_lens=seq_lens),
                               torch.ops.diyflash.attention(q, k, v, seq_lens=full), rtol=0, atol=0)
    with pytest.raises(ValueError, match=re.escape("got seq_lens[0] = 4294967299")):
        diyflash.flash_attention(q, k, v, seq_lens=seq_lens, validate="sync")
    ok = torch.tensor([3, 8], dtype=torch.int64, device=device)
    torch.testing.assert_close(torch.ops.diyflash.attention(q, k, v, seq_lens=ok),
                               torch.ops.diyflash.attention(q, k, v, seq_lens=ok.int()), rtol=0, atol=0)


@pytest.mark.skipif(not ON_GPU, reason="a CPU seq_lens beside CUDA inputs: GPU suite only")
def test_cpu_seq_lens_beside_cuda_inputs_are_moved(device):
    """The one documented exception to "every tensor on one device": the op moves the few integers."""
    q, k, v = make_qkv(2, 2, 8, 8, 16, torch.float16, device)
    on_cpu = torch.tensor([3, 8], dtype=torch.int32)
    torch.testing.assert_close(torch.ops.diyflash.attention(q, k, v, seq_lens=on_cpu),
                               torch.ops.diyflash.attention(q, k, v, seq_lens=on_cpu.to(device)), rtol=0, atol=0)


def test_backward_op_checks_its_inputs(device):
    q, k, v = make_qkv(1, 2, 8, 8, 16, torch.float32, device)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, False, None, None)
    with pytest.raises(ValueError, match=r"dout must have shape \(1, 2, 8, 16\), got \(1, 2, 7, 16\)"):
        torch.ops.diyflash.attention_bwd(out[:, :, :7], None, q, k, v, out, lse, False, None, None)
    phrase = f"inputs must be on one device, got q on {q.device}, dout on {q.device}, dlse on meta"
    with pytest.raises(ValueError, match=re.escape(phrase)):
        torch.ops.diyflash.attention_bwd(out, lse.to("meta"), q, k, v, out, lse, False, None, None)
    # dtypes: a wider dout reached tl.dot as fp32 against fp16 tiles (a Triton compile error); a half
    # lse was read as is, rounded
    for args, phrase in (
        ((out.double(), None, q, k, v, out, lse), "dout and out must have q's dtype torch.float32, got dout torch.float64"),
        ((out, None, q, k, v, out.half(), lse), "got dout torch.float32, out torch.float16"),
        ((out, None, q, k, v, out, lse.half()), "lse must have attention_fwd's lse dtype torch.float32 for "
                                                "torch.float32 inputs, got torch.float16"),
        ((out, lse.double(), q, k, v, out, lse), "dlse must have attention_fwd's lse dtype torch.float32"),
    ):
        with pytest.raises(TypeError, match=re.escape(phrase)):
            torch.ops.diyflash.attention_bwd(*args, False, None, None)


def _row_strided(t: torch.Tensor, how: str) -> torch.Tensor:
    """The values of t, (..., heads, N) fp32, with another row stride: stored heads-last ((B, N, H) or
    (N, BH) storage) or every other element of a wider buffer."""
    if how == "heads-last":
        return t.movedim(-2, -1).contiguous().movedim(-1, -2)
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


@pytest.mark.parametrize("how", ["heads-last", "every-other"])
@pytest.mark.parametrize("layout", ["bhnd", "3d"])
def test_backward_op_reads_lse_of_any_strides(device, layout, how):
    """lse and dlse are torch.ops.diyflash.attention_bwd's inputs like any other: with a row stride
    other than 1 it must give the same gradients, bit for bit. (The preprocessing kernel read lse as if
    its rows were contiguous: gradients off by ~2, silently.)"""
    q, k, v = make_qkv(2, 2, 40, 33, 16, torch.float16, device, layout=layout)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, True, None, None)
    dout, dlse = random_like(out), random_like(lse, seed=2)
    strided_lse, strided_dlse = _row_strided(lse, how), _row_strided(dlse, how)
    assert strided_lse.stride(-1) != 1 and torch.equal(strided_lse, lse) and torch.equal(strided_dlse, dlse)
    for dl, strided_dl in ((None, None), (dlse, strided_dlse)):
        want = torch.ops.diyflash.attention_bwd(dout, dl, q, k, v, out, lse, True, None, None)
        got = torch.ops.diyflash.attention_bwd(dout, strided_dl, q, k, v, out, strided_lse, True, None, None)
        for name, w, g in zip(("dq", "dk", "dv"), want, got):
            assert torch.equal(g, w), f"{name} differs by {(g.float() - w.float()).abs().max().item()}"
    args = (dout, strided_dlse, q, k, v, out, strided_lse, True, None, None)
    torch.library.opcheck(torch.ops.diyflash.attention_bwd.default, args, test_utils="ALL")
