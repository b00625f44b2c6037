"""Compiling ahead (diyflash/kernels/_compile.py, DirectLauncher.compile_ahead): a launch's kernel compiled on a
worker thread, the launch with its signature waiting for it; the backward's kernels compiled ahead by a forward
that needs gradients, with the signatures the backward then launches; every attention kernel hashed in one
order before a process's first compile, so its cache key does not depend on what the process compiled first.

The logic runs on test_launch's stand-in kernel everywhere; the attention launches' signatures on CPU through
the interpreter (their host side is the same) and on the GPU with the compiled kernels."""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

pytest.importorskip("triton")
import diyflash  # noqa: E402
from diyflash.kernels import _compile, _launch  # noqa: E402
from diyflash.kernels._launch import DirectLauncher  # noqa: E402
from helpers import ON_GPU  # noqa: E402
from test_launch import FakeKernel, kinds  # noqa: E402

gpu = pytest.mark.skipif(not ON_GPU, reason="compiled kernels: GPU suite only")


class WarmKernel(FakeKernel):
    """A FakeKernel the launcher takes for a compiled one, whose warmup (a compile without a launch) logs
    and takes a while, or raises."""

    def __init__(self, fails=False):
        super().__init__()
        self.fails = fails

    def warmup(self, *args, grid, **meta):
        time.sleep(0.05)
        self.log.append(("warmup", grid, args, meta))
        if self.fails:
            raise RuntimeError("compile failed")


@pytest.fixture
def ahead(fake_driver, monkeypatch):
    """Compiling ahead on a stand-in kernel: CUDA's device guard a no-op, no C launcher, switched on."""
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_launch, "_c_on", lambda: False)
    monkeypatch.setattr(_compile, "COMPILE_AHEAD", True)

    def make(**kw):
        kernel = WarmKernel(**kw)
        launch = DirectLauncher(kernel)
        launch.interpreted = False
        return kernel, launch
    return make


@pytest.mark.parametrize("fails", [False, True])
def test_a_launch_waits_for_its_compile_ahead(ahead, fails):
    """compile_ahead returns at once and compiles on a worker thread; the launch with that signature waits for
    it (then the JIT finds the kernel compiled), other signatures and bound kernels start nothing; a compile
    that failed ahead is left to the launch, which goes through the JIT as it would have."""
    kernel, launch = ahead(fails=fails)
    x = torch.zeros(8, dtype=torch.float16)
    meta = dict(BLOCK=16, FLAG=True, num_warps=4)
    assert launch.compile_ahead((4,), (x, x, 8), meta)
    assert not launch.compile_ahead((4,), (x, x, 8), meta)  # pending already
    assert kinds(kernel.log) == []  # not compiled in this thread
    launch((4,), x, x, 8, **meta)
    assert kinds(kernel.log) == ["warmup", "jit"] and kernel.log[0][2:] == ((x, x, 8), meta)
    assert launch._pending == {}
    assert not launch.compile_ahead((4,), (x, x, 9), meta) and not launch.compile_ahead((4,), (x, x, 8), meta)
    launch((4,), x, x, 8, **meta)
    assert kinds(kernel.log) == ["warmup", "jit", "direct"]


def test_registered_kernels_are_hashed_first_in_their_order(ahead, monkeypatch):
    """settle_hashes: before a process's first compile (a compile ahead or a launch through the JIT) the kernels
    registered with hash_first get their source hash, once, in the registered order, so a kernel's cache key does
    not depend on what the process compiled first (bench/results/kernel_hash_order_h200.txt)."""
    hashed = []

    class Hashed:
        def __init__(self, name):
            self.name = name

        @property
        def cache_key(self):
            hashed.append(self.name)
            return self.name

    monkeypatch.setattr(_compile, "_HASH_FIRST", [lambda: [Hashed("a"), Hashed("b")], lambda: [Hashed("c")]])
    monkeypatch.setattr(_compile, "_hashed", [False])
    kernel, launch = ahead()
    x = torch.zeros(8)
    launch.compile_ahead((1,), (x, x, 8), dict(BLOCK=16, FLAG=False))
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)
    launch((1,), x, x, 16, BLOCK=16, FLAG=False)
    assert hashed == ["a", "b", "c"]
    monkeypatch.setattr(_compile, "_hashed", [False])
    kernel, launch = ahead()
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)  # a first launch without compiling ahead hashes them first too
    assert hashed == ["a", "b", "c"] * 2


def test_compile_ahead_switched_off_starts_nothing(ahead, monkeypatch):
    kernel, launch = ahead()
    monkeypatch.setattr(_compile, "COMPILE_AHEAD", False)  # DIYFLASH_COMPILE_AHEAD=0 (or DIYFLASH_PLAIN=1)
    x = torch.zeros(8)
    assert not launch.compile_ahead((1,), (x, x, 8), dict(BLOCK=16, FLAG=False))
    launch((1,), x, x, 8, BLOCK=16, FLAG=False)
    assert kinds(kernel.log) == ["jit"] and launch._pending == {}
    interpreted = DirectLauncher(WarmKernel())  # the interpreter's kernels: nothing to compile
    monkeypatch.setattr(_compile, "COMPILE_AHEAD", True)
    assert not interpreted.compile_ahead((1,), (x, x, 8), dict(BLOCK=16, FLAG=False))


def _signatures_of(monkeypatch):
    """Record the signature of every launch and compile ahead of the attention launchers, as (kind, launcher
    id, signature); launches still run."""
    seen = []
    call, ahead_ = DirectLauncher.__call__, DirectLauncher.compile_ahead

    def launching(self, grid, *args, **meta):
        seen.append(("launch", id(self), self._signature(0, args, meta), tuple(grid)))
        return call(self, grid, *args, **meta)

    def compiling(self, grid, args, meta):
        seen.append(("ahead", id(self), self._signature(0, args, meta), tuple(grid)))
        return ahead_(self, grid, args, meta)

    monkeypatch.setattr(DirectLauncher, "__call__", launching)
    monkeypatch.setattr(DirectLauncher, "compile_ahead", compiling)
    return seen


@pytest.mark.parametrize("case", ["causal", "gqa window softcap", "dlse", "long"])
def test_a_backward_compiled_ahead_has_the_signatures_it_launches(monkeypatch, case):
    """attention_bwd(compile_only=True), which a forward that needs gradients runs first where it has no plan
    (attention_fwd's compile_backward): every launch of the real backward then finds its signature among
    those compiled ahead, so none compiles again; it launches nothing itself, allocates its outputs on the
    meta device and keeps no plan. (In CI the interpreter runs the kernels: the launches' host side is the
    same.)"""
    from diyflash.kernels.attention import launch as ka

    if case == "long" and not ON_GPU:
        pytest.skip("the Hopper backward's size (work past plans.HOST_DESC_MIN_WORK): too slow to interpret")
    dev = "cuda" if ON_GPU else "cpu"
    dtype = torch.float16 if ON_GPU else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    (z, h, n, d), h_kv = ((2, 4, 2048, 128) if case == "long" else (1, 2, 113, 64)), 1 if case.startswith("gqa") else 2
    q = torch.randn(z, h, n, d, device=dev, dtype=dtype, generator=gen)
    k, v = (torch.randn(z, h_kv, n, d, device=dev, dtype=dtype, generator=gen) for _ in range(2))
    kw = dict(window=(32, 0), softcap=20.0) if case.startswith("gqa") else {}
    out, lse = ka.attention_fwd(q, k, v, True, 0.125, None, **kw)
    dlse = torch.randn_like(lse) if case == "dlse" else None
    diyflash.clear_caches()
    seen = _signatures_of(monkeypatch)
    grads = ka.attention_bwd(out, dlse, q, k, v, out, lse, True, 0.125, None, compile_only=True,
                             deterministic=False, **kw)
    assert all(g.device.type == "meta" for g in grads)
    assert {s[0] for s in seen} == {"ahead"} and diyflash.cache_info()["attention plans"] == 0
    ahead_ = {s[1:] for s in seen}
    seen.clear()
    want = ka.attention_bwd(out.clone(), dlse, q, k, v, out, lse, True, 0.125, None, deterministic=False, **kw)
    launched = {s[1:] for s in seen if s[0] == "launch"}
    assert launched and launched <= ahead_, (launched - ahead_)
    assert all(g.device.type == dev for g in want)


def test_a_packed_backward_compiled_ahead_has_the_signatures_it_launches(monkeypatch):
    """The same for packed sequences (flash_attention_varlen's eager autograd asks for it): every launch of the
    backward finds its signature among those its compile-only run produced; nothing is launched then."""
    from diyflash.kernels.attention import Packed, launch as ka

    dev = "cuda" if ON_GPU else "cpu"
    dtype = torch.float16 if ON_GPU else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    cu = torch.tensor([0, 40, 57, 113], dtype=torch.int32, device=dev)
    q = torch.randn(113, 4, 64, device=dev, dtype=dtype, generator=gen)
    k, v = (torch.randn(113, 2, 64, device=dev, dtype=dtype, generator=gen) for _ in range(2))
    packed = Packed(cu, 56, 56)
    out, lse = ka.attention_fwd(q, k, v, True, 0.125, cu, packed=packed)
    diyflash.clear_caches()
    seen = _signatures_of(monkeypatch)
    grads = ka.attention_bwd(out, None, q, k, v, out, lse, True, 0.125, cu, packed=packed, compile_only=True,
                             deterministic=False)
    assert all(g.device.type == "meta" for g in grads)
    assert {s[0] for s in seen} == {"ahead"}
    ahead_ = {s[1:] for s in seen}
    seen.clear()
    ka.attention_bwd(out.clone(), None, q, k, v, out, lse, True, 0.125, cu, packed=packed, deterministic=False)
    launched = {s[1:] for s in seen if s[0] == "launch"}
    assert launched and launched <= ahead_, (launched - ahead_)


@gpu
@pytest.mark.parametrize("packed", [False, True])
def test_a_forward_with_gradients_compiles_its_backward_ahead(monkeypatch, packed):
    """flash_attention (flash_attention_varlen: packed) on inputs that need gradients, with no plan yet, has the
    backward's kernels compile ahead (the kernels' attention_fwd, compile_backward) with the signatures the
    backward then launches; the forward's second launch (the Hopper forward's marked pass, where it runs)
    compiles ahead too; without gradients no backward is compiled ahead. The results are those of calls without
    compiling ahead."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (2 * 2048, 4, 128) if packed else (2, 4, 2048, 128)
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    grad = torch.randn_like(q)
    cu = torch.tensor([0, 2048, 4096], dtype=torch.int32, device="cuda")

    def attend(q, k, v):
        if packed:
            return diyflash.flash_attention_varlen(q, k, v, cu, cu, 2048, 2048, causal=True)
        return diyflash.flash_attention(q, k, v, causal=True)
    results = {}
    for on in (True, False):
        monkeypatch.setattr(_compile, "COMPILE_AHEAD", on)
        diyflash.clear_caches()
        seen = _signatures_of(monkeypatch)
        with torch.no_grad():
            attend(q, k, v)
        # without gradients, only the forward's own launchers (its second pass, where it has one)
        assert {s[1] for s in seen if s[0] == "ahead"} <= {s[1] for s in seen if s[0] == "launch"}
        diyflash.clear_caches()
        seen.clear()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attend(*leaves)
        forward = len(seen)
        grads = torch.autograd.grad(out, leaves, grad)
        results[on] = (out, *grads)
        ahead_ = {s[1:] for s in seen[:forward] if s[0] == "ahead"}
        backward = {s[1:] for s in seen[forward:] if s[0] == "launch"}
        if on:
            assert backward and backward <= ahead_
        else:  # the forward's second pass may still be asked (compile_ahead then starts nothing), no backward kernel
            assert backward and not {s[0] for s in backward} & {s[0] for s in ahead_}
        monkeypatch.undo()
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)


_KEYS = """
import sys, torch, diyflash
from diyflash.kernels.attention import launch
q, k, v = (torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.float16) for _ in range(3))
if sys.argv[1] == "grad":  # the backward's kernels compile ahead, before the forward's
    q.requires_grad_()
diyflash.flash_attention(q, k, v, causal=True)
print({str(kernel): kernel.cache_key for kernel in launch._attention_kernels()})
"""


@gpu
def test_kernel_cache_keys_do_not_depend_on_the_first_call():
    """Two processes whose first call differs (a forward alone; a forward whose backward compiles ahead) key every
    attention kernel alike, so each finds the other's compiled kernels in Triton's cache. On the H200 (Triton 3.6)
    the forward's key differed before settle_hashes (bench/results/kernel_hash_order_h200.txt)."""
    import ast
    import subprocess
    import sys

    keys = [ast.literal_eval(subprocess.run([sys.executable, "-c", _KEYS, first], capture_output=True, text=True,
                                            check=True, timeout=600).stdout.strip().splitlines()[-1])
            for first in ("alone", "grad")]
    assert keys[0] == keys[1] and len(keys[0]) >= 9


@gpu
def test_a_refused_compile_ahead_leaves_the_forward(monkeypatch):
    """Where the backward's compile-only run raises, the forward still runs and returns its results: the
    backward itself raises it later, where it belongs."""
    from diyflash.kernels.attention import launch as ka

    def refuse(*args, **kwargs):
        raise ValueError("refused")

    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    want, want_lse = ka.attention_fwd(q, q, q, True, 0.125, None)
    monkeypatch.setattr(ka, "attention_bwd", refuse)
    diyflash.clear_caches()  # no plan: the compile-only run is reached
    out, lse = ka.attention_fwd(q, q, q, True, 0.125, None, compile_backward=dict(deterministic=False))
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
