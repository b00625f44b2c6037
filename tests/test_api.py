"""diyflash.flash_attention / reference_attention: every row of the seed's error table (type and
phrase, naming the bad values) and the seed's examples as written (device adapted)."""

import subprocess
import sys

import pytest
import torch

import diyflash
from diyflash import flash_attention, reference_attention
from helpers import ON_GPU, child_env, make_qkv


def qkv(device, shape=(2, 2, 16, 32), dtype=torch.float16):
    return tuple(torch.randn(shape, device=device, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize(
    "make, exc, phrases",
    [
        (lambda d: (torch.randn(16, 32, device=d),) * 3, ValueError, ["Expected 3D or 4D tensors", "q.dim()=2"]),
        (lambda d: (torch.randn(1, 2, 3, 4, 8, device=d),) * 3, ValueError, ["Expected 3D or 4D tensors", "5"]),
        (lambda d: (torch.randn(2, 2, 16, 32, device=d),) + qkv(d)[1:], TypeError, ["dtypes must match", "float32", "float16"]),
        (lambda d: qkv(d, dtype=torch.float64), TypeError, ["Unsupported dtype", "float64"]),
        (lambda d: qkv(d, dtype=torch.int32) if False else tuple(torch.ones(2, 2, 16, 32, dtype=torch.int32, device=d) for _ in range(3)),
         TypeError, ["Unsupported dtype", "int32"]),
        (lambda d: qkv(d, shape=(2, 2, 16, 12)), ValueError, ["Unsupported head_dim 12", "multiples of 8"]),
        (lambda d: qkv(d, shape=(2, 2, 16, 264)), ValueError, ["Unsupported head_dim 264", "256"]),
        (lambda d: (torch.randn(2, 2, 16, 32, device=d, dtype=torch.float16), torch.randn(2, 3, 16, 32, device=d, dtype=torch.float16),
                    torch.randn(2, 3, 16, 32, device=d, dtype=torch.float16)), ValueError, ["Incompatible shapes", "(2, 3, 16, 32)"]),
        (lambda d: (torch.randn(2, 2, 16, 32, device=d, dtype=torch.float16), torch.randn(2, 2, 16, 32, device=d, dtype=torch.float16),
                    torch.randn(2, 2, 15, 32, device=d, dtype=torch.float16)), ValueError, ["Incompatible shapes", "v (2, 2, 15, 32)"]),
        (lambda d: (torch.randn(2, 2, 16, 32, device=d, dtype=torch.float16), torch.randn(2, 2, 16, 64, device=d, dtype=torch.float16),
                    torch.randn(2, 2, 16, 64, device=d, dtype=torch.float16)), ValueError, ["Incompatible shapes", "head_dim"]),
        (lambda d: (torch.randn(4, 16, 32, device=d), torch.randn(2, 2, 16, 32, device=d), torch.randn(2, 2, 16, 32, device=d)),
         ValueError, ["Expected 3D or 4D tensors of the same rank", "k.dim()=4"]),
    ],
    ids=["2d", "5d", "dtype-mismatch", "float64", "int32", "head_dim-12", "head_dim-264", "heads", "v-shape",
         "k-head_dim", "rank-mismatch"],
)
def test_error_table(device, make, exc, phrases):
    q, k, v = make(device)
    with pytest.raises(exc) as info:
        flash_attention(q, k, v)
    for phrase in phrases:
        assert phrase in str(info.value), f"{phrase!r} not in {info.value!r}"


@pytest.mark.parametrize(
    "seq_lens, error, phrases, op_refuses",  # op_refuses: the ops' rule refuses it too (values are clamped)
    [
        (torch.tensor([16, 8], dtype=torch.float32), TypeError, ["int32 (or int64)", "torch.float32"], True),
        (torch.tensor([16, 8, 4], dtype=torch.int32), ValueError, ["shape (batch,) = (2,)", "(3,)"], True),
        (torch.tensor([16, 0], dtype=torch.int32), ValueError, ["0 < seq_lens[i] <= seq_len (16)", "seq_lens[1] = 0"],
         False),
        (torch.tensor([17, 4], dtype=torch.int64), ValueError, ["0 < seq_lens[i] <= seq_len (16)", "seq_lens[0] = 17"],
         False),
        ([16, 8], TypeError, ["torch.Tensor", "list"], False),
    ],
    ids=["dtype", "shape", "zero", "too-long", "not-tensor"],
)
def test_bad_seq_lens(device, seq_lens, error, phrases, op_refuses):
    """The API says the ops' seq_lens rule (ops/checks.py seq_lens_error), word for word, and checks the
    values besides (validate="sync": on the host, naming the value; tests/test_value_checks.py checks the
    default's device-side check)."""
    q, k, v = qkv(device)
    if isinstance(seq_lens, torch.Tensor):
        seq_lens = seq_lens.to(device)
    with pytest.raises(error) as info:
        flash_attention(q, k, v, seq_lens=seq_lens, validate="sync")
    for phrase in phrases:
        assert phrase in str(info.value)
    if op_refuses:
        with pytest.raises(error) as op_info:
            torch.ops.diyflash.attention(q, k, v, seq_lens=seq_lens)
        assert str(op_info.value) == f"diyflash::attention_fwd: {info.value}"


def test_seq_lens_int64_and_int32_agree(device):
    """int64 lengths are accepted as the ops accept them, with the int32 call's result."""
    q, k, v = qkv(device)
    lens = torch.tensor([16, 5], dtype=torch.int32, device=device)
    torch.testing.assert_close(flash_attention(q, k, v, seq_lens=lens.long()), flash_attention(q, k, v, seq_lens=lens),
                               rtol=0, atol=0)


def test_bad_sm_scale(device):
    q, k, v = qkv(device)
    with pytest.raises(TypeError, match="sm_scale must be a float"):
        flash_attention(q, k, v, sm_scale="0.1")
    with pytest.raises(ValueError, match="sm_scale must be finite, got nan"):
        flash_attention(q, k, v, sm_scale=float("nan"))


def test_cuda_required_outside_interpreter(monkeypatch):
    """CPU tensors without the interpreter: the seed's "CUDA tensors required" (the op still runs)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = qkv("cpu")
    with pytest.raises(ValueError, match="CUDA tensors required, got tensors on cpu"):
        flash_attention(q, k, v)
    out = torch.ops.diyflash.attention(q.float(), k.float(), v.float())  # PyTorch path
    torch.testing.assert_close(out, reference_attention(q.float(), k.float(), v.float()))


@pytest.mark.skipif(not ON_GPU, reason="needs two devices: a CUDA one and the CPU")
def test_mixed_devices(device):
    q, k, v = qkv(device)
    with pytest.raises(ValueError, match="same device, got q on cuda:0, k on cpu"):
        flash_attention(q, k.cpu(), v)
    on_cpu = torch.tensor([16, 8], dtype=torch.int32)  # the ops' rule: CPU lengths beside CUDA inputs are moved
    torch.testing.assert_close(flash_attention(q, k, v, seq_lens=on_cpu), flash_attention(q, k, v, seq_lens=on_cpu.cuda()),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="seq_lens must be on the inputs' device"):
        flash_attention(q, k, v, seq_lens=on_cpu.to("meta"))


def test_triton_required(tmp_path):
    """Without triton: the PyTorch path still works and the kernels say "triton is required"."""
    script = tmp_path / "no_triton.py"
    script.write_text(
        "import sys; sys.modules['triton'] = None\n"
        "import torch, diyflash\n"
        "q = torch.randn(1, 2, 8, 16)\n"
        "out = torch.ops.diyflash.attention(q, q, q)\n"
        "assert out.shape == q.shape\n"
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "try:\n"
        "    diyflash.flash_attention(q, q, q)\n"
        "except ModuleNotFoundError as e:\n"
        "    assert 'triton is required' in str(e), e\n"
        "    print('OK')\n"
    )
    env = child_env(TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr


def test_triton_installed_but_a_dependency_missing(tmp_path):
    """triton present, numpy absent (a clean venv with torch and triton only): the error names numpy and
    how to install it, not "triton is not installed" (issue 22: the main job failed that way)."""
    script = tmp_path / "no_numpy.py"
    script.write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'numpy' or name.startswith('numpy.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import torch, diyflash\n"
        "q = torch.randn(1, 2, 8, 16)\n"
        "try:\n"
        "    diyflash.flash_attention(q, q, q)\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name, '|', e)\n"
    )
    env = child_env(TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("numpy |"), done.stdout
    assert "not installed" not in done.stdout and "pip install numpy" in done.stdout, done.stdout


def test_empty_inputs_return_empty(device):
    for shape in ((0, 2, 16, 32), (2, 2, 0, 32), (0, 16, 32)):
        q, k, v = qkv(device, shape=shape)
        out = flash_attention(q, k, v, causal=True)
        assert out.shape == q.shape and out.dtype == q.dtype


def test_3d_equals_4d(device):
    q, k, v = make_qkv(2, 3, 20, 20, 16, torch.float16, device)
    out4 = flash_attention(q, k, v, causal=True)
    out3 = flash_attention(*(t.reshape(6, 20, 16) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out3.view_as(out4), out4, rtol=0, atol=0)


# ---- the seed's examples (docs/003 "示例"), run as written with the device adapted --------------------
# On CPU (interpreter) the (2, 8, 512, 64) inputs take ~10 s each; on the GPU they are instant.


def test_seed_example_basic_causal_varlen(device):
    q = torch.randn(2, 8, 512, 64, device=device, dtype=torch.float16)
    k = torch.randn(2, 8, 512, 64, device=device, dtype=torch.float16)
    v = torch.randn(2, 8, 512, 64, device=device, dtype=torch.float16)
    out = flash_attention(q, k, v)
    assert out.shape == (2, 8, 512, 64) and out.dtype == torch.float16
    out = flash_attention(q, k, v, causal=True)
    assert out.shape == q.shape
    seq_lens = torch.tensor([256, 512], device=device, dtype=torch.int32)
    out = flash_attention(q, k, v, seq_lens=seq_lens)
    assert (out[0, :, 256:] == 0).all()
    ref = reference_attention(q[:1, :, :256], k[:1, :, :256], v[:1, :, :256])
    torch.testing.assert_close(out[:1, :, :256], ref, rtol=1e-2, atol=1e-2)


def test_seed_example_3d(device):
    q_3d = torch.randn(16, 512, 64, device=device, dtype=torch.float16)
    k_3d = torch.randn(16, 512, 64, device=device, dtype=torch.float16)
    v_3d = torch.randn(16, 512, 64, device=device, dtype=torch.float16)
    out_3d = flash_attention(q_3d, k_3d, v_3d)
    assert out_3d.shape == (16, 512, 64)


def test_seed_example_reference(device):
    q = torch.randn(2, 8, 128, 64, device=device, dtype=torch.float16)
    k = torch.randn(2, 8, 128, 64, device=device, dtype=torch.float16)
    v = torch.randn(2, 8, 128, 64, device=device, dtype=torch.float16)
    flash_out = flash_attention(q, k, v, causal=True)
    ref_out = reference_attention(q, k, v, causal=True)
    assert torch.allclose(flash_out, ref_out, rtol=1e-2, atol=1e-2)


def test_public_names():
    for name in ("flash_attention", "triton_matmul", "reference_attention", "AdaptiveKernelSelector",
                 "check_hopper_features", "get_attention_config", "get_matmul_config", "get_optimal_attention",
                 "get_optimal_matmul", "supports_fp8"):
        assert name in diyflash.__all__ and callable(getattr(diyflash, name)), name
    from diyflash.reference import reference_attention as seed_path  # the seed's kernels.flash_attn

    assert seed_path is reference_attention


def _fwd_ad_cases(device):
    """(name, f) for every op and API function, each a function of its first tensor input."""
    from diyflash import triton_matmul

    q, k, v = make_qkv(1, 2, 17, 17, 16, torch.float32, device)
    out, lse = torch.ops.diyflash.attention_fwd(q, k, v, False, None, None)
    b = torch.randn(16, 24, device=device)
    return [
        ("attention_fwd", q, lambda x: torch.ops.diyflash.attention_fwd(x, k, v, False, None, None)[0]),
        ("attention_bwd", out, lambda g: torch.ops.diyflash.attention_bwd(g, None, q, k, v, out, lse, False, None, None)[0]),
        ("matmul", q[0, 0], lambda a: torch.ops.diyflash.matmul(a, b)),
        ("triton_matmul", q[0, 0], lambda a: triton_matmul(a, b)),
    ]


@pytest.mark.parametrize("case", ["attention_fwd", "attention_bwd", "matmul", "triton_matmul"])
def test_forward_mode_ad_refused_by_every_op(device, case):
    """Issue 23: jvp through matmul or attention_fwd called by name gave an all-zero tangent, jacfwd an
    all-zero Jacobian, a dual tensor no tangent. Every op (and triton_matmul's eager shortcut) refuses."""
    import torch.autograd.forward_ad as forward_ad

    _, x, f = next(c for c in _fwd_ad_cases(device) if c[0] == case)
    message = "no forward-mode derivative"
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(f, (x,), (torch.randn_like(x),))
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jacfwd(lambda t: f(t).sum())(x)
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match=message):
        f(forward_ad.make_dual(x, torch.randn_like(x)))
    with forward_ad.dual_level():  # a dual level with no dual input: nothing to refuse
        assert torch.equal(f(x), f(x))
    if case != "attention_bwd":  # reverse mode still works (attention_bwd has no double backward)
        t = x.detach().requires_grad_()
        (grad,) = torch.autograd.grad(f(t).sum(), t)
        assert grad.shape == x.shape and not grad.isnan().any()


@pytest.mark.parametrize("via", ["api", "op"])
def test_forward_mode_ad_is_refused_not_a_zero_tangent(device, via):
    """The attention has no forward-mode derivative. PyTorch would run it as if the inputs had no
    tangents (torch.func.jvp returned a zero tangent, a dual-tensor forward an output without one);
    diyflash.flash_attention and torch.ops.diyflash.attention refuse instead, under vmap too."""
    import torch.autograd.forward_ad as forward_ad

    q, k, v = make_qkv(1, 2, 17, 17, 16, torch.float32, device)
    f = (lambda x: flash_attention(x, k, v)) if via == "api" else (lambda x: torch.ops.diyflash.attention(x, k, v))
    message = "no forward-mode derivative"
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(f, (q,), (torch.randn_like(q),))
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jacfwd(lambda x: f(x).sum())(q)
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(torch.vmap(f), (q[None].expand(2, -1, -1, -1, -1),), (q[None].expand(2, -1, -1, -1, -1),))
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match=message):
        f(forward_ad.make_dual(q, torch.randn_like(q)))
    with forward_ad.dual_level():  # a dual level with no dual input: nothing to refuse
        assert torch.equal(f(q), f(q))
    # vmap alone and reverse mode still work
    batched = torch.vmap(f)(q[None].expand(3, -1, -1, -1, -1).contiguous())
    assert torch.equal(batched[1], f(q))
    x = q.detach().requires_grad_()
    (grad,) = torch.autograd.grad(f(x).sum(), x)
    assert grad.shape == q.shape and not grad.isnan().any()


@pytest.mark.parametrize("call", ["causal", "use_autotune", "allow_tf32"])
def test_flags_must_be_bools(device, call):
    """Issue 23: causal="no" and use_autotune="no" were read as True (bool("no"))."""
    q, k, v = make_qkv(1, 2, 8, 8, 16, torch.float32, device)
    with pytest.raises(TypeError, match=f"{call} must be a bool, got str 'no'"):
        if call == "causal":
            flash_attention(q, k, v, causal="no")
        else:
            diyflash.triton_matmul(q[0, 0], k[0, 0].mT, **{call: "no"})


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPU suite only")
def test_seq_lens_call_can_be_captured_in_a_cuda_graph(device):
    """Issue 23: flash_attention(..., seq_lens=...) failed to capture ("operation failed due to a previous
    error during capture"): its eager value check synced. While capturing it is skipped (the kernels
    clamp); the replay equals the eager call."""
    q, k, v = make_qkv(2, 2, 64, 64, 32, torch.float16, device)
    seq_lens = torch.tensor([17, 64], dtype=torch.int32, device=device)
    eager = flash_attention(q, k, v, causal=True, seq_lens=seq_lens)
    static_out = None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        flash_attention(q, k, v, causal=True, seq_lens=seq_lens)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flash_attention(q, k, v, causal=True, seq_lens=seq_lens)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, eager, rtol=0, atol=0)


def test_deterministic_must_be_a_bool_or_none(device):
    q, k, v = make_qkv(1, 2, 8, 8, 16, torch.float32, device)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="deterministic must be a bool or None, got str 'no'"):
        flash_attention(q, k, v, deterministic="no")
    with pytest.raises(TypeError, match="deterministic must be a bool or None, got int 1"):
        diyflash.flash_attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu,
                                        8, 8, deterministic=1)
