"""DirectLauncher (diyflash/kernels/_launch.py): after the first JIT launch with a call signature, later
launches with that signature run the compiled kernel directly, with exactly what the JIT would pass it,
and any change Triton specializes on goes back through the JIT.

The logic is tested on a stand-in kernel (runs everywhere); the GPU tests show the real kernels take
the direct path and that it computes what the JIT path computes, including for a misaligned operand
of the same shape and strides (a different specialization)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

import diyflash  # noqa: E402
from diyflash.kernels import _launch  # noqa: E402
from diyflash.kernels._launch import DirectLauncher  # noqa: E402
from helpers import ON_GPU  # noqa: E402


class FakeCompiled:
    function = "fn-handle"
    packed_metadata = ("meta",)

    def __init__(self, log):
        self.log = log

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        self.log.append(("direct", args))


class FakeKernel:
    """Stand-in for a JITFunction: kernel[grid](*args, **meta) logs the JIT launch."""

    arg_names = ["x", "y", "n", "BLOCK", "FLAG"]

    def __init__(self, compiles=True):
        self.log = []
        self.pre_run_hooks = []
        self.compiles = compiles

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append(("jit", grid, args, meta))
            return FakeCompiled(self.log) if self.compiles else None
        return launch


def kinds(log):
    return [entry[0] for entry in log]


def test_second_launch_is_direct_with_the_jits_arguments(fake_driver):
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    x, y = torch.zeros(8, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    for _ in range(3):
        launch((4, 2), x, y, 8, FLAG=True, BLOCK=16, num_warps=4)
    assert kinds(kernel.log) == ["jit", "direct", "direct"]
    assert launch.direct_launches == 2
    # grid padded to 3-D, Triton's stream, compiled handles, then every parameter in signature order
    # (the call site named BLOCK and FLAG in the other order; num_warps is an option, not a parameter)
    assert kernel.log[1][1] == (4, 2, 1, 1234, "fn-handle", ("meta",), None, *_hooks(), x, y, 8, 16, True)


def _hooks():
    """The launch hooks a direct launch passes: Triton's own, or None for an empty HookChain (nothing to call)."""
    from triton import knobs

    return tuple(None if getattr(h, "calls", None) == [] else h
                 for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def test_a_launch_hook_gets_its_metadata_on_direct_launches(fake_driver, monkeypatch):
    """A launch-enter hook (a profiler's, e.g. Triton's proton) set after the first launch is passed on
    direct launches with the kernel's launch metadata, as the JIT passes them; without hooks neither is
    built (_launch._hook)."""
    from triton import knobs

    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    x = torch.zeros(8, dtype=torch.float16)
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)
    assert kernel.log[1][1][6:9] == (None, *_hooks())

    def hook(metadata):
        return None

    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "calls"):  # Triton 3.6: a HookChain (its list replaced for the test, then restored)
        monkeypatch.setattr(chain, "calls", [hook])
        expected = chain
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
        expected = hook
    monkeypatch.setattr(FakeCompiled, "launch_metadata", lambda self, grid, stream, *args: ("metadata", grid))
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)
    assert kernel.log[2][1][6:8] == (("metadata", (1,)), expected)


@pytest.mark.parametrize("change", ["alignment", "dtype", "int value", "constexpr", "option"])
def test_what_triton_specializes_on_goes_back_through_the_jit(fake_driver, change):
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    buf = torch.zeros(64, dtype=torch.float16)
    x, y = buf[:8], buf[8:16]  # both 16-byte aligned
    base = dict(args=(x, y, 8), meta=dict(BLOCK=16, FLAG=False, num_warps=4))
    launch((1,), *base["args"], **base["meta"])
    other = {
        "alignment": dict(base, args=(buf[1:9], y, 8)),  # same shape and strides, 2-byte offset
        "dtype": dict(base, args=(x.float(), y, 8)),
        "int value": dict(base, args=(x, y, 16)),
        "constexpr": dict(base, meta=dict(base["meta"], BLOCK=32)),
        "option": dict(base, meta=dict(base["meta"], num_warps=8)),
    }[change]
    launch((1,), *other["args"], **other["meta"])
    launch((1,), *base["args"], **base["meta"])
    assert kinds(kernel.log) == ["jit", "jit", "direct"]


def test_descriptor_signature(fake_driver):
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    t = torch.zeros(64, 64, dtype=torch.float16)
    desc = lambda block: TensorDescriptor.from_tensor(t, block)  # noqa: E731
    for block in ([16, 16], [16, 16], [32, 16], [32, 16]):
        launch((1,), desc(block), desc(block), 64, BLOCK=16, FLAG=False)
    assert kinds(kernel.log) == ["jit", "direct", "jit", "direct"]


def test_pre_run_hooks_disable_the_direct_path(fake_driver):
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    x = torch.zeros(8)
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)
    assert kinds(kernel.log) == ["jit", "jit"]


def test_defaulted_parameter_or_no_compiled_kernel_keeps_the_jit(fake_driver):
    x = torch.zeros(8)
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    for _ in range(2):
        launch((1,), x, x, 8, BLOCK=16)  # FLAG left to a default: only the JIT knows its value
    interpreted = FakeKernel(compiles=False)  # what the interpreter returns: no compiled kernel
    launch_i = DirectLauncher(interpreted)
    for _ in range(2):
        launch_i((1,), x, x, 8, BLOCK=16, FLAG=False)
    assert kinds(kernel.log) == ["jit", "jit"] and kinds(interpreted.log) == ["jit", "jit"]
    assert launch.direct_launches == launch_i.direct_launches == 0


def test_signature_cache_is_bounded(fake_driver, monkeypatch):
    monkeypatch.setattr(_launch, "MAX_SIGNATURES", 2)
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    x = torch.zeros(8)
    for n in (1, 2, 16, 1, 16):  # three int classes: 1, not a multiple of 16, a multiple of 16
        launch((1,), x, x, n, BLOCK=16, FLAG=False)
    # 1 and 2 are kept; 16 finds the cache full, clears it and is kept alone; 1 goes through the JIT again
    # and is kept beside 16, which then launches directly
    assert kinds(kernel.log) == ["jit", "jit", "jit", "jit", "direct"]
    assert len(launch._compiled) == 2


def test_ints_of_one_triton_class_launch_directly_with_their_own_value(fake_driver):
    """A decode step against a cache one token longer changes lengths and strides but not how Triton
    specializes them: the second launch is direct and passes its own value (a key of exact values sent
    each step of transformers' growing DynamicCache back through the JIT)."""
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    x = torch.zeros(8)
    for n in (17, 18, 4097, 32, 4096, 2**31, 2**32 + 16, 2**32 + 1):
        launch((1,), x, x, n, BLOCK=16, FLAG=False)
    assert kinds(kernel.log) == ["jit", "direct", "direct", "jit", "direct", "jit", "direct", "jit"]
    assert [entry[1][-3] for entry in kernel.log if entry[0] == "direct"] == [18, 4097, 4096, 2**32 + 16]


def test_a_positional_constexpr_is_keyed_by_value(fake_driver):
    kernel = FakeKernel()
    kernel.constexprs = [2]  # n is a constexpr here: each value is its own kernel
    launch = DirectLauncher(kernel)
    x = torch.zeros(8)
    for n in (17, 18, 18):
        launch((1,), x, x, n, BLOCK=16, FLAG=False)
    assert kinds(kernel.log) == ["jit", "jit", "direct"]


def test_int_classes_match_tritons_specialization():
    """_int_class puts two ints together exactly where Triton's own specialization does (the installed
    Triton's native_specialize_impl: what its JIT keys a compiled kernel on)."""
    specialize = getattr(pytest.importorskip("triton._C.libtriton"), "native_specialize_impl", None)
    if specialize is None:
        pytest.skip("this Triton has no native_specialize_impl to compare with")
    from triton.backends.compiler import BaseBackend

    samples = [0, 1, 2, 15, 16, 17, 4096, 4097, -1, -16, 2**31 - 16, 2**31 - 1, -2**31, -2**31 - 1, 2**31, 2**31 + 1,
               2**40, -2**40, -2**40 - 3, 2**63 - 16, 2**63, 2**63 + 1, 2**64 - 16, 2**64 - 1]
    triton_key = {x: specialize(BaseBackend, x, False, True, True) for x in samples}
    for a in samples:
        for b in samples:
            assert (_launch.int_class(a) == _launch.int_class(b)) == (triton_key[a] == triton_key[b]), (a, b)


# ---- the real kernels, compiled (GPU) -----------------------------------------------------------------
def test_bound_launch_runs_the_compiled_kernel_with_new_pointers(fake_driver):
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    x, y, x2, y2 = (torch.zeros(8, dtype=torch.float16) for _ in range(4))
    assert launch.bind((4,), (x, y), (8,), dict(BLOCK=16, FLAG=True)) is None  # nothing compiled yet
    launch((4,), x, y, 8, BLOCK=16, FLAG=True)
    bound = launch.bind((4,), (x, y), (8,), dict(BLOCK=16, FLAG=True))
    assert launch.bind((4,), (x, y), (16,), dict(BLOCK=16, FLAG=True)) is None  # another signature
    bound(x2, y2)
    assert kinds(kernel.log) == ["jit", "direct"] and launch.direct_launches == 1
    assert kernel.log[1][1] == (4, 1, 1, 1234, "fn-handle", ("meta",), None, *_hooks(), x2, y2, 8, 16, True)
    kernel.pre_run_hooks.append(lambda *a, **k: None)  # hooks added since binding: the JIT runs them
    bound(x2, y2)
    assert kinds(kernel.log) == ["jit", "direct", "jit"]


def test_bound_launch_runs_with_new_arguments_of_its_classes(fake_driver):
    """run_with: the bound kernel with other arguments after the pointers (a decode step against a cache
    one token longer, whose plan is keyed on the arguments' classes); a count that does not match, or
    hooks added since binding, go through the launcher."""
    kernel = FakeKernel()
    launch = DirectLauncher(kernel)
    x, y = torch.zeros(8), torch.zeros(8)
    launch((4,), x, y, 17, BLOCK=16, FLAG=True)
    bound = launch.bind((4,), (x, y), (17,), dict(BLOCK=16, FLAG=True))
    bound.run_with((y, x), (18,))
    assert kinds(kernel.log) == ["jit", "direct"] and kernel.log[1][1][-5:] == (y, x, 18, 16, True)
    bound.run_with((x, y), (19, 20))  # not this launch's arguments: the launcher decides (the JIT here)
    assert kinds(kernel.log) == ["jit", "direct", "jit"]


gpu = pytest.mark.skipif(not ON_GPU, reason="the interpreter has no compiled kernels: nothing launches directly")


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_direct_launch_matches_and_respects_alignment(dtype):
    from diyflash.kernels import matmul as km

    gen = torch.Generator(device="cuda").manual_seed(0)
    # 136 = 128 + 8 columns: a row slice starting at column 1 is misaligned with the same strides
    buf_a = torch.randn(200, 136, device="cuda", dtype=dtype, generator=gen)
    buf_b = torch.randn(136, 104, device="cuda", dtype=dtype, generator=gen)
    a, b = buf_a[:, :128], buf_b[:128]
    first = diyflash.triton_matmul(a, b)
    before = km._KERNEL.direct_launches
    second = diyflash.triton_matmul(a, b)
    assert km._KERNEL.direct_launches == before + 1
    assert torch.equal(first, second)
    # same shape and strides, 2-byte offset: not TMA-describable, a different kernel; must still be right
    a_off = buf_a[:, 1:129]
    assert a_off.stride() == a.stride() and a_off.data_ptr() % 16 != 0
    for _ in range(2):
        got = diyflash.triton_matmul(a_off, b)
        want = (a_off.double() @ b.double()).to(dtype)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@gpu
@pytest.mark.parametrize("c_on", [True, False])
def test_first_launch_leaves_tritons_launcher_unbuilt_where_the_c_launcher_runs(c_on):
    """A signature's first launch through the C launcher loads the kernel without building Triton's launcher
    (a C build of its own with empty caches); the JIT, launching it later, builds it then. With the C
    launcher off the first launch is the JIT's, as before."""
    from diyflash.kernels._claunch import module as c_launcher

    before = _launch.use_c_launcher(c_on)
    try:
        launcher = DirectLauncher(_add_one)
        x = torch.zeros(100, device="cuda")
        block = 128 if c_on else 256  # a kernel of its own for each case (Triton caches compiled kernels)
        launcher((1, ), x, 100, BLOCK=block)
        (compiled, _names), = launcher._compiled.values()
        lazy = isinstance(compiled._run, _launch._LazyLauncher)
        assert lazy == (c_on and c_launcher() is not None)
        launcher((1, ), x, 100, BLOCK=block)
        assert launcher.direct_launches == 1
        _add_one[(1, )](x, 100, BLOCK=block)
        assert not isinstance(compiled._run, _launch._LazyLauncher)
        assert torch.equal(x, torch.full_like(x, 3.0))
    finally:
        _launch.use_c_launcher(before)


@gpu
def test_attention_direct_launches_match():
    from diyflash.kernels.attention import launch as ka, launch_bwd as kb

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 3, 113, 80, device="cuda", dtype=torch.float16, generator=gen).requires_grad_()
               for _ in range(3))
    grad = torch.randn(2, 3, 113, 80, device="cuda", dtype=torch.float16, generator=gen)
    launchers = (ka._FWD, kb._BWD_PRE, kb._BWD_DKDV, kb._BWD_DQ)
    results = []
    for _ in range(2):
        before = [x.direct_launches for x in launchers]
        out = diyflash.flash_attention(q, k, v, causal=True)
        results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    assert [x.direct_launches for x in launchers] == [n + 1 for n in before]
    for first, second in zip(*results):
        assert torch.equal(first, second)


@gpu
def test_attention_plans_replay_and_match():
    """A repeated attention call replays its plan (the launches of its first call, bound to their
    compiled kernels): bit-identical results; a misaligned input of the same shape and strides, a 3-D
    layout and an lse gradient get plans of their own and stay right."""
    from diyflash.kernels.attention import launch as ka
    from diyflash.reference import attention_ref

    gen = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.randn(3, 2, 3, 113, 88, device="cuda", dtype=torch.float16, generator=gen)
    q, k, v = (buf[i, ..., :80] for i in range(3))  # 176-byte rows: 16-byte aligned, TMA-readable
    dout = torch.randn(2, 3, 113, 80, device="cuda", dtype=torch.float16, generator=gen)
    diyflash.clear_caches()
    runs = []
    for _ in range(3):
        out, lse = ka.attention_fwd(q, k, v, True, 0.1, None)
        runs.append((out, lse, *ka.attention_bwd(dout, None, q, k, v, out, lse, True, 0.1, None)))
    assert diyflash.cache_info()["attention plans"] == 2
    for first, later in zip(runs[0], runs[2]):
        assert torch.equal(first, later)
    flat = torch.randn(buf.numel() + 8, device="cuda", dtype=torch.float16, generator=gen)
    off = flat[1:1 + buf.numel()].view(buf.shape)  # buf's strides, base 2 bytes past alignment
    cases = {
        "misaligned": (off[0, ..., :80], off[1, ..., :80], off[2, ..., :80], dout, None),
        "3-d": (*(t.reshape(6, 113, 80) for t in (q.contiguous(), k.contiguous(), v.contiguous())),
                dout.reshape(6, 113, 80), None),
        "dlse": (q, k, v, dout, torch.randn(2, 3, 113, device="cuda", generator=gen)),
    }
    for name, (q_, k_, v_, g_, dlse) in cases.items():
        leaves = [t.detach().double().requires_grad_() for t in (q_, k_, v_)]
        ref, ref_lse = attention_ref(*leaves, causal=True, scale=0.1)
        if dlse is None:
            want = torch.autograd.grad(ref, leaves, g_.double())
        else:
            want = torch.autograd.grad((ref, ref_lse), leaves, (g_.double(), dlse.double()))
        for _ in range(2):  # first call plans, second replays
            out, lse = ka.attention_fwd(q_, k_, v_, True, 0.1, None)
            grads = ka.attention_bwd(g_, dlse, q_, k_, v_, out, lse, True, 0.1, None)
            torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-3, msg=name)
            for got, w in zip(grads, want):
                torch.testing.assert_close(got.double(), w, rtol=0, atol=2e-2, msg=name)
    assert diyflash.cache_info()["attention plans"] == 2 + 2 + 2 + 1  # the lse-gradient case shares the first forward's plan


@gpu
def test_attention_plans_keep_explicit_tiles_apart():
    """Calls with explicit tiles or head groups (benchmarks, the tile sweep) replay plans of their own:
    each runs the tiles it names, not those of the plan of the tuned call, and gives the same result."""
    from dataclasses import replace

    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import BwdConfig, bwd_config, fwd_config

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(2, 3, 256, 64, device="cuda", dtype=torch.float16, generator=gen) for _ in range(4))
    fwd = fwd_config(64, q.dtype, q.device, True, False, 256)
    bwd = bwd_config(64, q.dtype, q.device, True, False, 256)
    other = replace(fwd, block_m=fwd.block_m // 2)
    other_bwd = BwdConfig(replace(bwd.dkdv, block_n=bwd.dkdv.block_n // 2), bwd.dq)
    diyflash.clear_caches()
    calls = [dict(), dict(config=other), dict(group=2)]
    for _ in range(2):  # plan, then replay
        outs = [ka.attention_fwd(q, k, v, True, 0.125, None, **kw) for kw in calls]
        for o, lse in outs[1:]:
            torch.testing.assert_close(o, outs[0][0], atol=2e-3, rtol=0)
        bwd_calls = [dict(), dict(config=other_bwd), dict(group=2)]
        grads = [ka.attention_bwd(dout, None, q, k, v, *outs[0], True, 0.125, None, **kw) for kw in bwd_calls]
        for got in grads[1:]:
            for a, b in zip(got, grads[0]):
                torch.testing.assert_close(a, b, atol=2e-2, rtol=0)
    assert diyflash.cache_info()["attention plans"] == 6
    tiles = {key[-2:]: plan.launches[0][0].grid[0] for key, plan in ka.PLANS.items() if key[0] == "fwd"}
    assert tiles == {(None, None): 256 // fwd.block_m, (other, None): 256 // other.block_m, (None, 2): 256 // fwd.block_m}



def test_one_pass_rule():
    """Which calls the one-pass backward serves (launch_bwd.ONE_PASS: D64, 4096 rows or more, fp16/bf16, a GPU
    with TMA) where the call allows it, and what one_pass=True refuses."""
    from diyflash.kernels.attention.launch_bwd import one_pass_backward

    f16, bf16 = torch.float16, torch.bfloat16
    assert one_pass_backward(False, None, 64, 4096, f16) and one_pass_backward(False, None, 64, 8192, bf16)
    assert not one_pass_backward(True, None, 64, 8192, f16)  # deterministic
    assert not one_pass_backward(False, None, 64, 1024, f16)  # short: measured slower
    assert not one_pass_backward(False, None, 128, 8192, f16)  # D128: measured slower
    assert not one_pass_backward(False, None, 64, 8192, torch.float32)
    assert not one_pass_backward(False, None, 64, 8192, f16, tma=False)  # its tiles' bulk reduce needs TMA
    assert one_pass_backward(False, True, 128, 16, torch.float32) and not one_pass_backward(False, False, 64, 8192, f16)
    with pytest.raises(ValueError, match="cannot be deterministic"):
        one_pass_backward(True, True, 64, 8192, f16)
    with pytest.raises(ValueError, match="head_dim <= 128 only"):
        one_pass_backward(False, True, 256, 8192, f16)
