"""The C++ replay of a plan (kernels/_cplan.py): the same launches with the same arguments as the Python
replay, so the same bits; the build, its checks of a program, and the Python path where it is off."""

from __future__ import annotations

import pytest
import torch

import diyflash
from diyflash.kernels import _claunch, _cplan
from helpers import ON_GPU, make_qkv


def _compiler_or_skip():
    try:
        return _cplan._compiler()
    except RuntimeError:
        pytest.skip("no C++ compiler on this machine: the replay stays Python's (tested on the GPU suite's machine)")


@pytest.fixture(scope="module")
def built():
    """The module built here (CPU too: the build needs torch's headers and a compiler, not a GPU), bound to
    the C launcher's entry points (without libcuda they report no current context)."""
    _compiler_or_skip()
    mod = _cplan._import(_cplan.build())
    mod.bind(_claunch.build()._C_API)
    return mod


def test_a_program_is_checked_when_made(built):
    assert built.make(1, ((0, 0), (1, 0), (2, (3, 4), torch.float32)), (), (0, 1, 2), 0, 16) is not None
    with pytest.raises(IndexError, match="shaped by input 5 of 1"):
        built.make(1, ((0, 5),), (), (0,), 0, 16)
    with pytest.raises(IndexError, match="reads value -3"):
        built.make(1, ((0, 0),), ((object(), (0, -3), False),), (0,), 0, 16)
    with pytest.raises(IndexError, match="returns allocation 2 of 1"):
        built.make(1, ((0, 0),), (), (2,), 0, 16)
    with pytest.raises(TypeError, match=r"not \(0, i\), \(1, i\) or \(2, shape, dtype\)"):
        built.make(1, ((2, (3,), "float32"),), (), (), 0, 16)
    with pytest.raises(TypeError, match="2 inputs given, the program takes 1"):
        built.run(built.make(1, (), (), (), 0, 16), 0, (torch.zeros(1), torch.zeros(1)))


@pytest.mark.skipif(ON_GPU, reason="on the GPU a CUDA context is current: the GPU tests below replay")
def test_nothing_runs_without_a_current_context(built):
    program = built.make(1, ((0, 0),), (), (0,), 0, 16)
    assert built.run(program, 0, (torch.zeros(2),)) is None
    assert built.run(program, 0, (torch.zeros(2),), None) is None  # (values None: the program's own)
    with pytest.raises(TypeError, match="tuple of the program's 0 launches' scalars"):
        built.run(program, 0, (torch.zeros(2),), ((1,),))


def test_off_means_python_replays(monkeypatch):
    monkeypatch.setattr(_cplan, "ENABLED", False)
    monkeypatch.setattr(_cplan, "_state", {})
    assert _cplan.module() is None and _cplan.ready() is None
    assert "off" in _cplan.reason()


def test_a_failed_build_says_why(monkeypatch):
    monkeypatch.setattr(_cplan, "_state", {})
    monkeypatch.setattr(_cplan, "c_launcher", _claunch.build)  # (here without libcuda too)
    monkeypatch.setattr(_cplan, "_compiler", lambda: (_ for _ in ()).throw(RuntimeError("no C++ compiler found")))
    assert _cplan.ready(timeout=60) is None
    assert "no C++ compiler found" in _cplan.reason()


CASES = [  # (b, h, h_kv, n, d, dtype, kwargs): a portable and a Hopper forward (bf16 D128), GQA, a window
    (2, 4, 4, 128, 64, torch.float16, dict()),
    (1, 8, 2, 256, 128, torch.bfloat16, dict(causal=True)),
    (2, 4, 4, 113, 80, torch.bfloat16, dict(causal=True, window_size=(32, 0))),
]


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[5]}-d{c[4]}-{sorted(c[6])}")
def test_cpp_replays_are_bit_identical_to_python_replays(case, fresh_caches):
    """Forward and backward replayed by their C++ programs and by Python, on the same inputs: the same bits,
    strides and dtypes (deterministic=True: the default backward's dq adds in any order)."""
    from diyflash.ops import attention_fast

    if _cplan.ready() is None:
        pytest.skip(f"the C++ replay could not be built here: {_cplan.reason()}")
    b, h, h_kv, n, d, dtype, kwargs = case
    q = make_qkv(b, h, n, n, d, dtype, "cuda", seed=1)[0].requires_grad_()
    k, v = (t.requires_grad_() for t in make_qkv(b, h_kv, n, n, d, dtype, "cuda", seed=2)[1:])
    dout = torch.randn_like(q)
    results = {}
    for turn in range(4):  # ordinary; fast forward (its program made); both fast (the backward's made); both C++
        q.grad = k.grad = v.grad = None
        out = diyflash.flash_attention(q, k, v, deterministic=True, **kwargs)
        out.backward(dout)
        results[turn] = (out, q.grad, k.grad, v.grad)
    (fast,) = [entry[0] for entry in attention_fast._FAST.values() if entry is not None]
    (backward,) = fast.backwards.values()
    assert isinstance(fast.program, _cplan.Program) and isinstance(backward.program, _cplan.Program)
    before = _cplan.use(False)  # Python's replays (the node then runs its Python backward)
    try:
        q.grad = k.grad = v.grad = None
        out = diyflash.flash_attention(q, k, v, deterministic=True, **kwargs)
        out.backward(dout)
    finally:
        _cplan.use(before)
    python = (out, q.grad, k.grad, v.grad)
    for turn in range(4):
        for a, b_ in zip(results[turn], python):
            assert a.dtype == b_.dtype and a.stride() == b_.stride() and torch.equal(a, b_)


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
def test_cpp_replay_is_captured_in_a_cuda_graph(fresh_caches):
    """Inside a CUDA graph capture the C++ replay's allocations come from the graph's pool, as torch's do: the
    replayed graph recomputes the output for new inputs copied in place."""
    if _cplan.ready() is None:
        pytest.skip(f"the C++ replay could not be built here: {_cplan.reason()}")
    q, k, v = make_qkv(1, 4, 128, 128, 64, torch.float16, "cuda", seed=3)
    for _ in range(3):
        diyflash.flash_attention(q, k, v, causal=True)
    from diyflash.ops import attention_fast

    (fast,) = [entry[0] for entry in attention_fast._FAST.values() if entry is not None]
    assert isinstance(fast.program, _cplan.Program)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        diyflash.flash_attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = diyflash.flash_attention(q, k, v, causal=True)
    q2 = torch.randn_like(q)
    q.copy_(q2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, diyflash.flash_attention(q2, k, v, causal=True))


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
@pytest.mark.parametrize("index", range(4), ids=lambda i: f"kv-case{i}")
def test_cpp_kv_replays_are_bit_identical_to_python_replays(index, fresh_caches):
    """A decode step of a known layout (flash_attention_with_kvcache's fast path: splits merged in the launch
    or by the combine launch, paged, left padding, lse returned or kept) replayed by its C++ program and by
    Python: the same bits."""
    from diyflash.ops import attention_fast
    from test_attention_fast import KV_CASES, _kv_inputs

    if _cplan.ready() is None:
        pytest.skip(f"the C++ replay could not be built here: {_cplan.reason()}")
    q, kc, vc, lens, kwargs = _kv_inputs(KV_CASES[index], "cuda")
    outs = [diyflash.flash_attention_with_kvcache(q, kc, vc, lens, **kwargs) for _ in range(3)]
    (fast,) = [f for f in attention_fast._FAST_KV.values() if f is not None]
    assert fast.program and isinstance(fast.program[0], _cplan.Program)
    fast.program = False
    outs.append(diyflash.flash_attention_with_kvcache(q, kc, vc, lens, **kwargs))
    for out in outs[1:]:
        for a, b in zip(out if isinstance(out, tuple) else (out,), outs[0] if isinstance(outs[0], tuple) else (outs[0],)):
            assert a.stride() == b.stride() and torch.equal(a, b)


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
@pytest.mark.parametrize("n_k", [1000, 8190])
def test_a_growing_cache_runs_the_program_before_with_its_own_scalars(n_k, fresh_caches, monkeypatch):
    """The decode route on caches one token longer every step (transformers' DynamicCache: torch.cat, new strides),
    four layers a step: a step's first call takes the C++ call of the step before, or of an earlier step whose
    lengths had the same int classes, with its own launch scalars (FastKV.grown), without looking the plan up
    again (fast_kvcache) but where the length first reaches a class (8192: divisible by 16) or the step before
    had no C++ call, and every output equals the Python replay's, bit for bit."""
    from diyflash.kernels import attention as kernels
    from diyflash.ops import attention_fast

    if _cplan.ready() is None:
        pytest.skip(f"the C++ replay could not be built here: {_cplan.reason()}")
    looked_up = []
    lookup = kernels.fast_kvcache
    monkeypatch.setattr(kernels, "fast_kvcache", lambda *args: looked_up.append(args[1].shape[2]) or lookup(*args))
    gen = torch.Generator(device="cuda").manual_seed(6)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    caches = [[torch.randn(1, 8, n_k, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2)]
              for _ in range(4)]
    grown = 0
    for _ in range(6 if n_k == 1000 else 20):
        for layer in caches:
            new = torch.randn(2, 1, 8, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            layer[:] = [torch.cat([t, n], dim=2) for t, n in zip(layer, new)]
        outs = [diyflash.flash_attention(q, k, v, causal=True) for k, v in caches]
        (decode,) = [entry for entry in attention_fast._FAST.values() if entry is not None]
        grown += decode.last is not None and decode.last[1].values is not None
        before = _cplan.use(False)
        try:
            python = [diyflash.flash_attention(q, k, v, causal=True) for k, v in caches]
        finally:
            _cplan.use(before)
        for a, b in zip(outs, python):
            assert torch.equal(a, b)
    # the first step (whose first call runs the ordinary path); at 8190 also the steps whose ints first take a
    # class: 8191 (the unbounded left side 1 + 8191), 8192, 8193 (a class pair of its own, no plan yet); 8207-8209
    # take theirs again, the plans of 8191-8193 (the caller's family)
    assert set(looked_up) == ({1001} if n_k == 1000 else {8191, 8192, 8193}), looked_up
    assert grown == (5 if n_k == 1000 else 17)


@pytest.mark.parametrize("splits, merge", [(1, False), (4, True), (4, False)])
@pytest.mark.parametrize("need_lse", [True, False])
def test_the_kv_program_is_given_the_buffers_python_takes(splits, merge, need_lse):
    """A decode step's C++ call is given, by name, the kept buffers the Python replay takes (the same tensors of
    the same store), and every partial the launches read is one of them, out or lse."""
    from diyflash.kernels.attention import kvcache

    q = torch.randn(2, 4, 1, 8)
    call = kvcache.CallLayout(args=(), var=None, block_m=16, row_tiles=1, splits=splits, tiles=8, merge=merge,
                              paged=False, page_size=1, n_new=0, capacity=64, num_pages=1, grows=())
    keep = ("test", 0, 0)  # (a store of its own in kvcache._KEPT)
    try:
        out, lse = kvcache._outputs(q, 8, need_lse, keep)
        python = kvcache._partials(q, out, lse, call, keep)
        names = kvcache._kept_names(call, need_lse)
        given = dict(zip(names, kvcache._kept_inputs(q, call, keep, need_lse)))
        assert ("lse" in given) == (not need_lse) and (not need_lse) <= (given.get("lse") is lse)
        for name in ("dst", "dst_lse", "counts"):
            if name in given:
                assert given[name] is python[name]
            else:  # the C++ call's sources: out or lse (kvcache.FastKV._program)
                assert python[name] is out or python[name] is lse
    finally:
        for key in [key for key in kvcache._KEPT if key[0] == "test"]:
            del kvcache._KEPT[key]


def _node_inputs(built, causal=True):
    """q, k, v requiring grad, the op's out and lse with its graph, and the same out and lse computed without
    autograd and given the C++ node (a Cache with no Program: its backward is the Python one)."""
    from diyflash.ops import attention_fast

    q, k, v = (t.requires_grad_() for t in make_qkv(2, 4, 17, 23, 16, torch.float32, seed=4))
    ref = diyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    built.set_backward(attention_fast._node_backward)
    with torch.no_grad():
        out, lse = diyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    cache = built.cache_new(0)
    return (q, k, v), ref, lambda: built.attach(q, k, v, out.clone(), lse.clone(), cache, True, causal, None, -1, 0,
                                                0.0, -1)


def test_the_node_gives_the_ops_gradients(built):
    """The fast path's autograd node (_cplan.cpp Attention) with its Python backward: the op's gradients bit for
    bit, through out alone (dlse None) and through out and lse; its grad_fn is the node, out is not a view."""
    inputs, (ref_out, ref_lse), attach = _node_inputs(built)
    out, lse = attach()
    assert out.grad_fn.name() == "torch::autograd::CppNode<diyflash::Attention>" and out._base is None
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ref = torch.autograd.grad(ref_out, inputs, dout, retain_graph=True)
    for a, b in zip(ref, torch.autograd.grad(out, inputs, dout, retain_graph=True)):
        assert torch.equal(a, b)
    ref = torch.autograd.grad((ref_out, ref_lse), inputs, (dout, dlse))
    for a, b in zip(ref, torch.autograd.grad((out, lse), inputs, (dout, dlse))):
        assert torch.equal(a, b)


def test_the_node_behaves_as_an_autograd_function(built):
    """What autograd promises of a node: a Python error in its backward reaches the caller, an in-place change of
    a saved output is caught, saved-tensor hooks see its five tensors, and compiled autograd traces it (its
    Python backward calling the op) to the same gradients."""
    from torch._dynamo import compiled_autograd

    from diyflash.ops import attention_fast

    inputs, (ref_out, _), attach = _node_inputs(built)
    dout = torch.randn_like(ref_out)
    ref = torch.autograd.grad(ref_out, inputs, dout)
    out, _ = attach()
    built.set_backward(lambda *args: (_ for _ in ()).throw(ValueError("a backward's error")))
    try:
        with pytest.raises(ValueError, match="a backward's error"):
            torch.autograd.grad(out, inputs, dout)
    finally:
        built.set_backward(attention_fast._node_backward)
    out, _ = attach()
    loss = (out * dout).sum()
    with torch.no_grad():
        out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out, _ = attach()
    assert len(packed) == 5
    for a, b in zip(ref, torch.autograd.grad(out, inputs, dout)):
        assert torch.equal(a, b)
    out, _ = attach()
    for t in inputs:
        t.grad = None
    with compiled_autograd._enable(torch.compile(backend="eager", fullgraph=True)):
        (out * dout).sum().backward()
    for a, t in zip(ref, inputs):
        assert torch.equal(a, t.grad)


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
def test_the_node_runs_its_program_without_python(fresh_caches, monkeypatch):
    """A fast-path forward under autograd gets the C++ node; its first backward of a layout runs the ordinary path
    (keeping the plan), the second replays it from Python (making its Program, given to the node), and later
    ones run the Program without calling Python: the same gradients as the ordinary path's (deterministic)."""
    from diyflash.ops import attention_fast

    if _cplan.ready() is None:
        pytest.skip(f"the C++ replay could not be built here: {_cplan.reason()}")
    calls = []
    python_backward = attention_fast._node_backward
    monkeypatch.setattr(attention_fast, "_node_backward", lambda *args: calls.append(1) or python_backward(*args))
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 8, 256, 256, 128, torch.bfloat16, "cuda", seed=5))
    dout = torch.randn_like(q)
    grads = []
    for _ in range(5):
        out = diyflash.flash_attention(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), dout))
    assert out.grad_fn.name().endswith("CppNode<diyflash::Attention>")
    assert len(calls) == 2  # (the first call of the key ran the op, whose own autograd node is Python's)
    for got in grads[1:]:
        for a, b in zip(grads[0], got):
            assert torch.equal(a, b)
