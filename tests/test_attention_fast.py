"""The API's fast path (ops/attention_fast.py): a call of a layout seen before replays its plan, with the
ordinary path's results bit for bit, and leaves every case it cannot serve to the ordinary path."""

from __future__ import annotations

import pytest
import torch

import diyflash
import diyflash.api as api
from diyflash.kernels import value_checks
from helpers import ON_GPU, child_env, make_qkv

CASES = [  # (b, h, h_kv, n_q, n_k, d, d_v, dtype, layout, kwargs)
    (2, 4, 4, 128, 128, 64, 64, torch.float16, "bhnd", dict()),
    (2, 4, 4, 113, 77, 80, 80, torch.bfloat16, "bnhd", dict(causal=True)),
    (1, 8, 2, 256, 256, 128, 128, torch.bfloat16, "bhnd", dict(causal=True, window_size=(64, 0), softcap=30.0)),
    (2, 4, 1, 64, 200, 64, 32, torch.float16, "bhnd", dict(sm_scale=0.3, return_lse=True)),
    (3, 2, 2, 65, 65, 32, 32, torch.float32, "3d", dict()),
]


def _inputs(case, device, requires_grad=False):
    b, h, h_kv, n_q, n_k, d, d_v, dtype, layout, kwargs = case
    q = make_qkv(b, h, n_q, n_q, d, dtype, device, layout=layout, seed=1)[0]
    k, v = make_qkv(b, h_kv, n_k, n_k, d, dtype, device, layout=layout, seed=2)[1:]
    v = v[..., :d_v]
    if requires_grad:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return q, k, v, kwargs


@pytest.fixture
def no_checks(monkeypatch):
    """Make the ordinary path fail: a call that still succeeds took the fast path."""
    def refuse(*args, **kwargs):
        raise AssertionError("the ordinary path ran")

    def patch():
        monkeypatch.setattr(api, "attention_arguments", refuse)
    return patch


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only; under the interpreter every call is ordinary")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[7]}-{c[8]}-{sorted(c[9])}")
def test_fast_path_is_bit_identical(case, fresh_caches, no_checks):
    q, k, v, kwargs = _inputs(case, "cuda")
    first = diyflash.flash_attention(q, k, v, **kwargs)  # ordinary: checks, plan
    no_checks()
    second = diyflash.flash_attention(q, k, v, **kwargs)  # the plan alone
    for a, b in zip(first if isinstance(first, tuple) else (first,), second if isinstance(second, tuple) else (second,)):
        assert torch.equal(a, b) and a.stride() == b.stride()


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: f"{c[7]}-{c[8]}-{sorted(c[9])}")
def test_fast_path_gradients_are_bit_identical(case, fresh_caches, no_checks, monkeypatch):
    """Three steps: the ordinary path (its plans), the fast forward with the ordinary backward (which
    leaves its plan beside the fast forward), then both replayed: the same bits each time."""
    import diyflash.ops.attention_fast as fast

    def refuse(*args, **kwargs):
        raise AssertionError("the ordinary backward ran")

    grads = []
    for turn in range(3):
        if turn == 1:
            no_checks()
        if turn == 2:
            monkeypatch.setattr(fast, "attention_backward", refuse)
        q, k, v, kwargs = _inputs(case, "cuda", requires_grad=True)
        out = diyflash.flash_attention(q, k, v, deterministic=True, **kwargs)  # bitwise comparable dq
        out.backward(torch.ones_like(out) / out.numel() ** 0.5)
        grads.append((out, q.grad, k.grad, v.grad))
    for a, b, c in zip(*grads):
        assert torch.equal(a, b) and torch.equal(a, c)
    # the replayed backward's row statistics (delta, its second lse) came from buffers kept per stream
    (backward,) = [b for entry in fast._FAST.values() if entry is not None for b in entry[0].backwards.values()]
    assert [key[-1] for key in backward.kept] == [("delta", "lse2")]


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
def test_an_lse_nobody_reads_is_kept_per_stream(fresh_caches):
    """A short call without autograd or return_lse writes its lse to a buffer kept per stream (no
    allocation): the same output bits; return_lse=True, another stream and a CUDA graph capture each get
    an lse of their own."""
    from diyflash.ops import attention_fast

    q, k, v, _ = _inputs(CASES[1], "cuda")
    want = diyflash.flash_attention(q, k, v, causal=True)
    fast = next(entry[0] for entry in attention_fast._FAST.values() if entry is not None)
    fast.program = False  # the Python replay keeps buffers (the C++ one allocates them: tests/test_cplan.py)
    assert fast.kept == {}
    outs = [diyflash.flash_attention(q, k, v, causal=True) for _ in range(2)]
    ((kept,),) = fast.kept.values()
    assert all(torch.equal(out, want) for out in outs)
    out, lse = fast(q, k, v, need_lse=False)
    assert lse.data_ptr() == kept.data_ptr() and torch.equal(out, want)
    out, lse = fast(q, k, v)  # the caller reads it: its own
    assert lse.data_ptr() != kept.data_ptr()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        side_lse = fast(q, k, v, need_lse=False)[1]
    torch.cuda.current_stream().wait_stream(side)
    assert side_lse.data_ptr() != kept.data_ptr() and len(fast.kept) == 2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_lse = fast(q, k, v, need_lse=False)[1]
    assert graph_lse.data_ptr() not in {t.data_ptr() for ts in fast.kept.values() for t in ts} and len(fast.kept) == 2
    big = torch.randn(1, 4, 1 << 17, 64, device="cuda", dtype=torch.float16)
    diyflash.flash_attention(big, big[..., :64, :], big[..., :64, :])
    big_fast = [entry[0] for key, entry in attention_fast._FAST.items() if entry is not None and key[0] == big.shape]
    assert big_fast and big_fast[0].kept is None  # 2^19 rows: its allocation is hidden by its GPU time


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
def test_what_the_fast_path_leaves_to_the_ordinary_path(fresh_caches):
    """A call of a known layout still runs the ordinary path where it must: another argument type
    (refused as before), misaligned inputs (another key), the decode route (no dense plan), autocast,
    DIYFLASH's caches cleared."""
    q, k, v, _ = _inputs(CASES[0], "cuda")
    want = diyflash.flash_attention(q, k, v)
    with pytest.raises(TypeError, match="causal must be a bool"):
        diyflash.flash_attention(q, k, v, causal=1)
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
    shifted = buf[1:].view_as(q).copy_(q)  # 2 bytes past a 16-byte boundary
    assert torch.equal(diyflash.flash_attention(shifted, k, v), want)
    assert torch.equal(diyflash.flash_attention(shifted, k, v), want)
    decode = q[:, :, :1]
    assert torch.equal(diyflash.flash_attention(decode, k, v), diyflash.flash_attention(decode, k, v))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = diyflash.flash_attention(q.float(), k.float(), v.float())
    assert got.dtype == torch.bfloat16
    assert diyflash.cache_info()["attention fast calls"] >= 3
    diyflash.clear_caches()
    assert diyflash.cache_info()["attention fast calls"] == 0
    assert torch.equal(diyflash.flash_attention(q, k, v), want)


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
def test_fast_path_compiles_without_graph_breaks(fresh_caches):
    """A layout known to the fast path, then compiled: Dynamo never traces the fast path (0 graph breaks)."""
    q, k, v, _ = _inputs(CASES[0], "cuda")
    want = diyflash.flash_attention(q, k, v, causal=True)
    diyflash.flash_attention(q, k, v, causal=True)
    explained = torch._dynamo.explain(lambda a, b, c: diyflash.flash_attention(a, b, c, causal=True))(q, k, v)
    assert explained.graph_break_count == 0
    compiled = torch.compile(lambda a, b, c: diyflash.flash_attention(a, b, c, causal=True), fullgraph=True)
    assert torch.equal(compiled(q, k, v), want)


def test_cpu_calls_stay_ordinary(device):
    """Under the interpreter there are no plans: a second call of a layout runs the ordinary path again
    (its checks included), with the same result."""
    q, k, v, _ = _inputs(CASES[0], device)
    q, k, v = q[:, :, :32], k[:, :, :32], v[:, :, :32]
    first = diyflash.flash_attention(q, k, v)
    assert torch.equal(diyflash.flash_attention(q, k, v), first)
    with pytest.raises(TypeError, match="causal must be a bool"):
        diyflash.flash_attention(q, k, v, causal="yes")


def test_decode_route_calls_of_a_known_layout_skip_the_checks(device, fresh_caches, no_checks, monkeypatch):
    """A few query rows (the decode route) against keys one step longer each call, as on transformers'
    DynamicCache: after one ordinary call, calls of other key lengths and strides skip the argument checks
    and the op layers (checks refused), with the op's results bit for bit, and on CUDA a layout seen before
    replays its KV-cache plan (FastKV); what the key cannot vouch for still reaches the ordinary path: k and
    v of two lengths, inputs that need grad."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(2, 8, 1, 64, generator=gen).to(device, torch.float16)
    caches = [torch.randn(2, 2, n, 64, generator=gen).to(device, torch.float16) for n in (40, 41, 90)]
    caches.append(torch.randn(2, 97, 2, 64, generator=gen).to(device, torch.float16).transpose(1, 2))
    kw = dict(causal=True, window_size=(50, 0))
    want = [torch.ops.diyflash.attention_fwd(q, kv, kv, True, None, None, 50, 0) for kv in caches]
    assert torch.equal(diyflash.flash_attention(q, caches[0], caches[0], **kw), want[0][0])  # ordinary: checks
    diyflash.flash_attention(q, caches[0], caches[0], return_lse=True, **kw)
    no_checks()
    for kv, (out, lse) in zip(caches, want):
        assert torch.equal(diyflash.flash_attention(q, kv, kv, **kw), out)
        got = diyflash.flash_attention(q, kv, kv, return_lse=True, **kw)
        assert torch.equal(got[0], out) and torch.equal(got[1], lse)
    if ON_GPU:  # caches of a layout seen before (a decode step's later layers) replay its FastKV
        from diyflash.kernels.attention import kvcache

        replays = []
        real = kvcache.FastKV.__call__
        monkeypatch.setattr(kvcache.FastKV, "__call__", lambda *a: replays.append(1) or real(*a))
        for _ in range(2):
            assert torch.equal(diyflash.flash_attention(q, caches[2], caches[2], **kw), want[2][0])
        assert len(replays) == 2
    with pytest.raises(AssertionError, match="the ordinary path ran"):
        diyflash.flash_attention(q, caches[0], caches[1], **kw)  # k and v of two lengths: no key
    with pytest.raises(AssertionError, match="the ordinary path ran"):
        diyflash.flash_attention(q.detach().requires_grad_(), caches[0], caches[0], **kw)


KV_CASES = [  # (b, h, h_kv, n_q, cache, d, dtype, paged, kwargs)
    (1, 32, 8, 1, 1024, 128, torch.bfloat16, False, dict()),
    (2, 8, 8, 3, 512, 64, torch.float16, False, dict(causal=True, window_size=(100, 0), return_lse=True)),
    (2, 8, 2, 1, 512, 64, torch.float16, True, dict(softcap=20.0, num_splits=3)),
    (3, 4, 4, 1, 256, 64, torch.float16, False, dict(validate=False, leftpad=True)),
]


def _kv_inputs(case, device, seed=0):
    b, h, h_kv, n_q, cache, d, dtype, paged, kwargs = case
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=gen).to(device, dtype)
    lens = torch.tensor([cache - 7 * i for i in range(b)], dtype=torch.int32, device=device)
    kwargs = dict(kwargs)
    if kwargs.pop("leftpad", False):
        kwargs["cache_leftpad"] = torch.tensor([3 * i for i in range(b)], dtype=torch.int32, device=device)
    if paged:
        page = 64
        pages = b * cache // page
        kc, vc = (torch.randn(pages, h_kv, page, d, generator=gen).to(device, dtype) for _ in range(2))
        kwargs["block_table"] = torch.randperm(pages, generator=gen).to(device, torch.int32).view(b, -1)
    else:
        kc, vc = (torch.randn(b, cache, h_kv, d, generator=gen).to(device, dtype).transpose(1, 2) for _ in range(2))
    return q, kc, vc, lens, kwargs


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
@pytest.mark.parametrize("case", KV_CASES, ids=lambda c: f"{c[6]}-paged{c[7]}-{sorted(c[8])}")
def test_kv_fast_path_is_bit_identical(case, fresh_caches, monkeypatch):
    """A decode step of a known layout: its plan replayed (the ordinary path refused), the same bits; with
    new lengths in the same tensor's place too (the values are the device's, the layout the key)."""
    q, kc, vc, lens, kwargs = _kv_inputs(case, "cuda")
    first = diyflash.flash_attention_with_kvcache(q, kc, vc, lens, **kwargs)

    def refuse(*args, **kw):
        raise AssertionError("the ordinary path ran")

    monkeypatch.setattr(api, "kvcache_error", refuse)
    # the value check (validate=True) replays its bound launch: the per-call check_kvcache does not run
    monkeypatch.setattr(value_checks, "check_kvcache", refuse)
    second = diyflash.flash_attention_with_kvcache(q, kc, vc, lens, **kwargs)
    for a, b in zip(first if isinstance(first, tuple) else (first,), second if isinstance(second, tuple) else (second,)):
        assert torch.equal(a, b)
    shorter = lens - 5
    got = diyflash.flash_attention_with_kvcache(q, kc, vc, shorter, **kwargs)
    monkeypatch.undo()
    diyflash.clear_caches()
    want = diyflash.flash_attention_with_kvcache(q, kc, vc, shorter, **kwargs)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(a, b)


_BAD_ON_THE_FAST_PATH = {  # (the call's setup, the bad value written after two good calls, the rule's words)
    "lengths": ("c = torch.randn(2, 4, 128, 64, device='cuda', dtype=torch.float16)\n"
                "lens = torch.tensor([100, 90], dtype=torch.int32, device='cuda')\n"
                "call = lambda: diyflash.flash_attention_with_kvcache(q, c, c, lens)\n",
                "lens[1] = 500", "cache_seqlens must be >= 0"),
    "pages": ("c = torch.randn(8, 4, 32, 64, device='cuda', dtype=torch.float16)\n"
              "lens = torch.tensor([100, 90], dtype=torch.int32, device='cuda')\n"
              "table = torch.arange(8, dtype=torch.int32, device='cuda').view(2, 4)\n"
              "call = lambda: diyflash.flash_attention_with_kvcache(q, c, c, lens, block_table=table)\n",
              "table[1, 0] = 8", "a block_table entry in use is not a page"),
}


@pytest.mark.skipif(not ON_GPU, reason="plans exist for CUDA calls only")
@pytest.mark.parametrize("bad", sorted(_BAD_ON_THE_FAST_PATH))
def test_kv_fast_path_keeps_the_value_check(tmp_path, bad):
    """validate=True on the fast path still queues the device-side check (its bound launch): a bad length
    or page stops the program (in a child process: the assert ends its CUDA context)."""
    import subprocess
    import sys

    setup, poison, rule = _BAD_ON_THE_FAST_PATH[bad]
    script = tmp_path / "bad.py"
    script.write_text(
        "import torch, diyflash\n"
        "q = torch.randn(2, 4, 1, 64, device='cuda', dtype=torch.float16)\n"
        + setup +
        "call(); call()\n"
        "torch.cuda.synchronize()\n"
        + poison + "\n"
        "try:\n"
        "    call()\n"
        "    torch.cuda.synchronize()\n"
        "except RuntimeError as e:\n"
        "    print('RAISED', str(e).splitlines()[0])\n")
    env = child_env(TRITON_INTERPRET=None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert "RAISED" in done.stdout and "device-side assert" in done.stdout, done.stdout + done.stderr[-2000:]
    assert rule in done.stderr, done.stderr[-2000:]


def test_fast_keys_refuse_what_the_ordinary_path_must_see(device):
    """Arguments a key could not tell from valid ones (1 == True, [a, b] vs (a, b), 0 == 0.0), tensors without
    a data pointer (fake, functorch-wrapped) and open forward-AD levels get no key: the ordinary path checks
    or dispatches them."""
    import torch.autograd.forward_ad as fwad
    from torch._subclasses.fake_tensor import FakeTensorMode

    from diyflash.ops.attention_fast import fast_key, kv_fast_key

    q, k, v, _ = _inputs(CASES[0], device)
    ok = dict(causal=False, sm_scale=None, window_size=(-1, -1), softcap=0.0, return_lse=False)
    assert fast_key(q, k, v, **ok) is not None
    for bad in (dict(causal=1), dict(window_size=[-1, -1]), dict(softcap=0), dict(sm_scale=1), dict(return_lse=0),
                dict(window_size=(True, 0))):
        assert fast_key(q, k, v, **{**ok, **bad}) is None, bad
    with FakeTensorMode() as mode:
        fq = mode.from_tensor(q)
        assert fast_key(fq, fq, fq, **ok) is None
    seen = []
    torch.func.grad(lambda x: (seen.append(fast_key(x, k, v, **ok)), x.sum())[1])(q.float())
    assert seen == [None]
    with fwad.dual_level():
        assert fast_key(q, k, v, **ok) is None
    lens = torch.tensor([8, 8], dtype=torch.int32, device=device)
    kv_ok = dict(causal=False, sm_scale=None, window_size=(-1, -1), softcap=0.0, return_lse=False, num_splits=0,
                 validate=True)
    assert kv_fast_key(q[:, :, :1], k, v, lens, None, None, **kv_ok) is not None
    for bad in (dict(validate="sync"), dict(num_splits=True), dict(causal=0)):
        assert kv_fast_key(q[:, :, :1], k, v, lens, None, None, **{**kv_ok, **bad}) is None, bad
    assert kv_fast_key(q[:, :, :1], k, v, [8, 8], None, None, **kv_ok) is None
    shifted = torch.empty(k.numel() + 1, dtype=k.dtype, device=device)[1:].view_as(k)
    assert kv_fast_key(q[:, :, :1], shifted, v, lens, None, None, **kv_ok) is None  # unaligned caches: no key
