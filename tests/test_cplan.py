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
    assert built.run(built.make(1, ((0, 0),), (), (0,), 0, 16), 0, (torch.zeros(2),)) is None


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
    fast.program = backward.program = False  # Python's replays
    q.grad = k.grad = v.grad = None
    out = diyflash.flash_attention(q, k, v, deterministic=True, **kwargs)
    out.backward(dout)
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
