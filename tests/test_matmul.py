"""diyflash::matmul / triton_matmul: numerics against float64 (2x plain PyTorch + band), layouts read
in place, manual tiles, autograd (and what it saves), opcheck, gradcheck, compile, export, errors."""

import re
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.export import Dim

import diyflash
from diyflash import triton_matmul
from diyflash.utils.validation import matmul_error_reports
from helpers import ON_GPU, child_env, copies_of

HALF = (torch.float16, torch.bfloat16)


def make(m, k, n, dtype, device, layout="nn", requires_grad=False, seed=0):
    """a (m, k) and b (k, n); layout letters: n = row-major, t = a transposed view of (k, m) / (n, k)
    storage, e = expanded (stride 0 rows), s = a slice of a wider buffer (non-dense)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def one(rows, cols, kind):
        if kind == "t":
            t = torch.randn(cols, rows, generator=gen).mT
        elif kind == "e":
            t = torch.randn(1, cols, generator=gen).expand(rows, cols)
        elif kind == "s":
            t = torch.randn(rows, cols + 5, generator=gen)[:, 2 : cols + 2]
        else:
            t = torch.randn(rows, cols, generator=gen)
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    a = one(m, k, layout[0])
    b = one(k, n, layout[1])
    return a, b


def check_matmul(a, b, grad=True, **kw):
    out, grads, reports = matmul_error_reports(lambda a, b: triton_matmul(a, b, **kw), a, b, grad=grad)
    assert out.shape == (a.shape[0], b.shape[1]) and out.dtype == a.dtype and out.is_contiguous()
    for g, t in zip(grads or (), (a, b)):
        assert g.dtype == t.dtype and g.shape == t.shape
    for r in reports:
        assert r.ok, str(r)
    return out


SHAPES = [(1, 1, 1), (17, 17, 17), (129, 33, 65), (40, 1000, 17), (64, 80, 48)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_shapes(device, dtype, m, k, n):
    check_matmul(*make(m, k, n, dtype, device, requires_grad=True))


@pytest.mark.parametrize("layout", ["tn", "nt", "tt", "en", "ne", "sn", "ns"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_layouts(device, dtype, layout):
    check_matmul(*make(48, 40, 56, dtype, device, layout=layout, requires_grad=True))


def test_transposed_inputs_are_not_copied(device):
    """A transposed view goes to the kernel as is: no copy of an operand appears in the trace."""
    a, b = make(64, 48, 32, torch.float16, device, layout="tt")
    assert not copies_of(lambda: triton_matmul(a, b), a, b)
    # the check itself sees a copy when there is one
    assert copies_of(lambda: triton_matmul(a.contiguous(), b), a, b)


@pytest.mark.parametrize("blocks", [(16, 16, 16), (32, 64, 32), (64, 32, 16), (16, 128, 64)])
def test_manual_block_sizes(device, blocks):
    a, b = make(70, 90, 130, torch.float16, device, requires_grad=True)
    bm, bn, bk = blocks
    check_matmul(a, b, block_m=bm, block_n=bn, block_k=bk)


def test_untuned_default(device):
    check_matmul(*make(100, 64, 72, torch.float16, device, requires_grad=True), use_autotune=False)


@pytest.mark.parametrize("kw, phrase", [
    (dict(block_m=32), "all three or none"),
    (dict(block_m=32, block_n=48, block_k=16), "block_n must be a positive power of two, got 48"),
    (dict(block_m=0, block_n=32, block_k=16), "block_m must be a positive power of two, got 0"),
    (dict(block_m=512, block_n=32, block_k=16), "block_m=512 is not supported"),
    (dict(block_m=32, block_n=32, block_k=256), "block_k=256 is not supported"),
    (dict(block_m=128, block_n=32, block_k=16), "block_m=128 exceeds the padded problem: M=50 pads to 64"),
])
def test_bad_block_sizes(device, kw, phrase):
    a, b = make(50, 32, 40, torch.float16, device)
    with pytest.raises(ValueError) as info:
        triton_matmul(a, b, **kw)
    assert phrase in str(info.value)


@pytest.mark.parametrize("make_args, exc, phrases", [
    (lambda d: (torch.randn(2, 3, 4, device=d), torch.randn(4, 5, device=d)), ValueError, ["Expected 2D tensors", "a.dim()=3"]),
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(5, 6, device=d)), ValueError,
     ["Incompatible dimensions", "a.shape[1] (4) != b.shape[0] (5)"]),
    (lambda d: (torch.randn(3, 4, device=d, dtype=torch.float16), torch.randn(4, 5, device=d)), TypeError,
     ["dtypes must match", "a torch.float16", "b torch.float32"]),
    (lambda d: (torch.randn(3, 4, device=d, dtype=torch.float64),) * 2, TypeError, ["Unsupported dtype torch.float64"]),
    (lambda d: (torch.ones(3, 4, device=d, dtype=torch.int8),) * 2, TypeError, ["Unsupported dtype torch.int8"]),
], ids=["3d", "dims", "dtypes", "float64", "int8"])
def test_error_table(device, make_args, exc, phrases):
    a, b = make_args(device)
    with pytest.raises(exc) as info:
        triton_matmul(a, b)
    for phrase in phrases:
        assert phrase in str(info.value), f"{phrase!r} not in {info.value!r}"


def test_cuda_required_outside_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    a, b = make(4, 4, 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match="CUDA tensors required, got tensors on cpu"):
        triton_matmul(a, b)
    torch.testing.assert_close(torch.ops.diyflash.matmul(a, b), a @ b)  # the op: torch.matmul path


@pytest.mark.parametrize("m,k,n", [(0, 5, 7), (5, 7, 0), (5, 0, 7), (0, 0, 0)])
def test_empty(device, m, k, n):
    a, b = make(m, k, n, torch.float16, device, requires_grad=True)
    out = triton_matmul(a, b)
    assert out.shape == (m, n) and (out == 0).all()
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


@pytest.mark.parametrize("need", ["a", "b", "both"])
def test_backward_saves_only_what_it_needs(device, need):
    a, b = make(24, 16, 20, torch.float32, device)
    a.requires_grad_(need in ("a", "both"))
    b.requires_grad_(need in ("b", "both"))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = torch.ops.diyflash.matmul(a, b)
    shapes = sorted(tuple(t.shape) for t in saved)
    want = {"a": [(16, 20)], "b": [(24, 16)], "both": [(16, 20), (24, 16)]}[need]
    assert shapes == want
    out.sum().backward()


def test_backward_is_deterministic(device):
    a, b = make(50, 70, 30, torch.float16, device, requires_grad=True)
    out = triton_matmul(a, b)
    g = torch.randn_like(out)
    first = torch.autograd.grad(out, (a, b), g, retain_graph=True)
    second = torch.autograd.grad(out, (a, b), g)
    assert all(torch.equal(x, y) for x, y in zip(first, second))


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("layout, blocks, dtype", [
    ("nn", None, torch.float32), ("tn", None, torch.float16), ("ne", [16, 16, 16], torch.float16),
    ("sn", None, torch.bfloat16), ("tt", [32, 32, 32], torch.float32),
])
def test_opcheck(device, layout, blocks, dtype, requires_grad):
    a, b = make(19, 23, 17, dtype, device, layout=layout, requires_grad=requires_grad)
    torch.library.opcheck(torch.ops.diyflash.matmul.default, (a, b, blocks, True, False), test_utils="ALL")


def test_gradcheck_float64():
    a, b = make(5, 7, 3, torch.float64, "cpu", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.diyflash.matmul(a, b), (a, b))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(32, 48) / 6)
        self.w2 = torch.nn.Parameter(torch.randn(48, 16) / 7)

    def forward(self, x):
        return torch.ops.diyflash.matmul(torch.relu(torch.ops.diyflash.matmul(x, self.w1)), self.w2)


def test_compile_fullgraph(device):
    torch.manual_seed(0)
    model = MLP().to(device)
    x = torch.randn(20, 32, device=device, requires_grad=True)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for rows in (20, 37):
        x = torch.randn(rows, 32, device=device, requires_grad=True)
        out_c, out_e = compiled(x), model(x)
        torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(out_e)
        params = [x, *model.parameters()]
        for gc, ge in zip(torch.autograd.grad(out_c, params, g), torch.autograd.grad(out_e, params, g)):
            torch.testing.assert_close(gc, ge, rtol=1e-5, atol=1e-5)


def test_export_and_reload(device, tmp_path):
    torch.manual_seed(0)
    model = MLP().to(device).eval()
    ep = torch.export.export(model, (torch.randn(20, 32, device=device),), dynamic_shapes={"x": {0: Dim("rows", min=2)}})
    assert "torch.ops.diyflash.matmul.default" in str(ep.graph)
    pt2, x_path, out_path = tmp_path / "mlp.pt2", tmp_path / "x.pt", tmp_path / "out.pt"
    torch.export.save(ep, str(pt2))
    x = torch.randn(45, 32, device=device)
    torch.save(x, x_path)
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, diyflash
        ep = torch.export.load(sys.argv[1])
        torch.save(ep.module()(torch.load(sys.argv[2])), sys.argv[3])
    """))
    done = subprocess.run([sys.executable, str(script), str(pt2), str(x_path), str(out_path)],
                          capture_output=True, text=True, env=child_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        torch.testing.assert_close(torch.load(out_path), model(x), rtol=1e-5, atol=1e-5)


def test_seed_examples(device):
    a = torch.randn(1024, 512, device=device, dtype=torch.float16)
    b = torch.randn(512, 2048, device=device, dtype=torch.float16)
    c = triton_matmul(a, b)
    torch.testing.assert_close(c, (a.float() @ b.float()).half(), rtol=1e-2, atol=1e-1)
    c = triton_matmul(a, b, block_m=128, block_n=256, block_k=64)
    assert c.shape == (1024, 2048)
    a_bf16 = torch.randn(1024, 512, device=device, dtype=torch.bfloat16)
    b_bf16 = torch.randn(512, 2048, device=device, dtype=torch.bfloat16)
    assert triton_matmul(a_bf16, b_bf16).dtype == torch.bfloat16


def test_fp32_is_fp32_accurate_by_default(device):
    a, b = make(64, 256, 64, torch.float32, device)
    ref = a.double() @ b.double()
    err = (triton_matmul(a, b).double() - ref).abs().max().item()
    assert err < 1e-4, err  # TF32 would be ~1e-2 here
    if ON_GPU:
        err_tf32 = (triton_matmul(a, b, allow_tf32=True).double() - ref).abs().max().item()
        assert err_tf32 > 10 * err  # the opt-in really changes the arithmetic


@pytest.mark.skipif(not ON_GPU, reason="large shapes and the autotuner need the GPU suite")
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("m,k,n,layout", [(4096, 4096, 4096, "nn"), (2048, 11008, 4096, "nn"),
                                          (4096, 4096, 4096, "tn"), (4096, 4096, 4096, "nt"), (1000, 4096, 1000, "nn")])
def test_large_gpu(device, dtype, m, k, n, layout):
    check_matmul(*make(m, k, n, dtype, device, layout=layout, requires_grad=True))
    from diyflash.kernels import matmul as km

    assert km.tuning_cache(), "the autotuner recorded nothing"


@pytest.mark.skipif(not ON_GPU, reason="64-bit offsets need > 2^31-element tensors: GPU suite only")
@pytest.mark.parametrize("layout", ["nn", "en"])
def test_64bit_offsets(device, layout):
    m, k, n = 2**31 // 4096 + 64, 4096, 64  # a has 2^31 + 2^18 elements
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=torch.float16, generator=gen)
    if layout == "en":
        a = a[:1].expand(m, k)
    b = torch.randn(k, n, device=device, dtype=torch.float16, generator=gen)
    c = triton_matmul(a, b)
    tail = slice(m - 100, m)
    torch.testing.assert_close(c[tail].double(), a[tail].double() @ b.double(), rtol=0, atol=0.25)


def test_plan_is_made_once_per_call_key(device):
    """The config, layout and grid are chosen once per (shapes, strides, dtype, device, alignment,
    options); an operand with the same shape and strides but a 2-byte offset (not TMA-describable)
    gets its own plan and the right answer."""
    from diyflash.kernels import matmul as km

    buf = torch.randn(40, 72, dtype=torch.float16).to(device)
    b = torch.randn(64, 24, dtype=torch.float16).to(device)
    aligned, shifted = buf[:, :64], buf[:, 1:65]
    assert aligned.stride() == shifted.stride() and shifted.data_ptr() % 16
    before = diyflash.cache_info()["matmul plans"]
    for _ in range(2):
        triton_matmul(aligned, b)
    assert diyflash.cache_info()["matmul plans"] == before + 1
    got = triton_matmul(shifted, b)
    assert diyflash.cache_info()["matmul plans"] == before + 2
    # the autotuner may pick a pointer-load twin for so small a product (their times are within noise),
    # so the aligned plan's layout follows its config; the shifted operand can never be described
    assert km.tma_layout(aligned, b) == (False, False) and km.tma_layout(shifted, b) is None
    plan = km.PLANS[km.plan_key(aligned, b, None, True, False)]
    tma = plan.cfg.use_tma and km.device_limits(device).tma
    assert plan.layout == ((False, False) if tma else None)
    assert km.PLANS[km.plan_key(shifted, b, None, True, False)].layout is None
    torch.testing.assert_close(got.float(), shifted.float() @ b.float(), atol=2e-2, rtol=2e-2)


def test_bad_block_sizes_fail_every_call(device):
    """A rejected tile choice is not remembered as a plan: the op raises on each call."""
    a, b = make(20, 24, 28, torch.float16, device)
    for _ in range(2):
        with pytest.raises(ValueError, match="block_m=64 exceeds the padded problem"):
            torch.ops.diyflash.matmul(a, b, [64, 16, 16])


@pytest.mark.parametrize("shapes, dtypes, exc, phrase", [
    (((4, 5), (5, 3)), (torch.float16, torch.bfloat16), TypeError, "dtypes must match, got a torch.float16 and b torch.bfloat16"),
    (((4, 5), (6, 3)), (torch.float16, torch.float16), ValueError, "a.shape[1]=5 != b.shape[0]=6"),
    (((4, 5, 1), (5, 3)), (torch.float16, torch.float16), ValueError, "expects 2-D a and b"),
])
def test_op_checks_its_operands(device, shapes, dtypes, exc, phrase):
    """torch.ops.diyflash.matmul called by name (no API checks) still says what is wrong, eagerly and
    at trace time (its fake)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b = (torch.zeros(s, dtype=d, device=device) for s, d in zip(shapes, dtypes))
    with pytest.raises(exc, match=re.escape(phrase)):
        torch.ops.diyflash.matmul(a, b)
    with FakeTensorMode() as mode, pytest.raises(exc, match=re.escape(phrase)):
        torch.ops.diyflash.matmul(mode.from_tensor(a), mode.from_tensor(b))


def test_op_checks_its_operands_devices(device):
    """Operands on two devices (here the test's device and meta) get an error naming each one's device,
    eagerly and at trace time, instead of a kernel reading another device's memory (the interpreter
    read the meta operand's missing data and returned a result)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = torch.zeros(4, 5, dtype=torch.float16, device=device)
    b = torch.zeros(5, 3, dtype=torch.float16, device="meta")
    phrase = f"diyflash::matmul: inputs must be on one device, got a on {a.device}, b on meta"
    with pytest.raises(ValueError, match=re.escape(phrase)):
        torch.ops.diyflash.matmul(a, b)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=re.escape(phrase)):
        torch.ops.diyflash.matmul(mode.from_tensor(a), mode.from_tensor(b))


@pytest.mark.parametrize("blocks, autotune", [((32, 32, 32), True), ((128, 64, 64), True), (None, False)])
def test_backward_takes_the_forwards_tile_choice(device, blocks, autotune):
    """Issue 23: dA and dB autotuned even when the forward pinned its tiles or said use_autotune=False, so
    pinned runs were not bit-exact in their gradients. The backward's products get the forward's tiles
    where they fit the gradient's shapes, else the untuned default: never the tuner."""
    from diyflash.kernels import matmul as km

    seen = []

    class Record(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.diyflash.matmul.default:
                seen.append((tuple(args[0].shape), args[2], args[3]))
            return func(*args, **(kwargs or {}))

    a = torch.randn(96, 40, device=device, requires_grad=True)  # dA's N is 40: 128-wide tiles do not fit it
    b = torch.randn(40, 200, device=device, requires_grad=True)
    before = dict(km.tuning_cache())
    kw = dict(block_m=blocks[0], block_n=blocks[1], block_k=blocks[2]) if blocks else dict(use_autotune=autotune)
    c = diyflash.triton_matmul(a, b, **kw)
    with Record():
        c.square().sum().backward()
    assert km.tuning_cache() == before, "the backward ran the autotuner"
    assert len(seen) == 2
    for shape, block_sizes, tune in seen:
        assert tune is False
        if blocks == (32, 32, 32):  # fits every gradient product
            assert list(block_sizes) == [32, 32, 32]
    if blocks == (128, 64, 64):
        # dA = dC (96, 200) @ B^T (200, 40): 96 pads to 128, 40 to 64, so the tiles fit and are kept;
        # dB = A^T (40, 96) @ dC (96, 200): block_m 128 exceeds M = 40 (padded: 64), so the default tiles
        assert list(seen[0][1]) == [128, 64, 64] and seen[1][1] is None
