"""The KV-cache call's host-speed machinery on the GPU: kept scratch buffers (per device, stream and thread),
plans replayed with new pointers and lengths, CUDA-graph capture of a decode loop, reduce-overhead
compile, and the split rule's waves. Numerics and semantics: test_attention_kvcache.py."""

import threading

import pytest
import torch

import diyflash
from diyflash.reference import attention_ref
from diyflash.utils.validation import error_report
from helpers import ON_GPU, KVCase, seeded_randn


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("leftpad", [False, True])
def test_cuda_graph_decode_loop_of_32_steps(device, leftpad):
    """32 decode steps captured in one CUDA graph (the lengths advance on the device) equal the eager loop;
    with leftpad, a left-padded batch (cache_leftpad, read on the device at every replay) under a window,
    as a static cache's compiled decode step of transformers runs it."""
    case = KVCase(b=2, h=8, h_kv=2, n_q=1, n_new=1, d=64, lens=(100, 3), capacity=256, page_size=16,
                dtype=torch.bfloat16, device=device, leftpad=(37, 2) if leftpad else None)
    extra = dict(cache_leftpad=case.leftpad, window_size=(40, -1)) if leftpad else {}
    steps = 32
    qs = seeded_randn((steps, *case.q.shape), case.q.dtype, device, 11)
    ks = seeded_randn((steps, *case.k.shape), case.k.dtype, device, 12)
    vs = seeded_randn((steps, *case.v.shape), case.v.dtype, device, 13)

    def loop(k_cache, v_cache, bt, seqlens, outs):
        for i in range(steps):
            outs[i] = diyflash.flash_attention_with_kvcache(qs[i], k_cache, v_cache, seqlens, ks[i], vs[i],
                                                            block_table=bt, causal=True, **extra)
            seqlens += 1

    eager_cache = case.caches(True)
    eager_outs = torch.empty(steps, *case.q.shape, dtype=case.q.dtype, device=device)
    loop(*eager_cache, case.seqlens.clone(), eager_outs)
    eager_first = eager_outs[0].clone()

    graph_cache = case.caches(True)
    seqlens = case.seqlens.clone()
    outs = torch.empty_like(eager_outs)
    loop(*case.caches(True), case.seqlens.clone(), torch.empty_like(eager_outs))  # warm-up: compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loop(*graph_cache, seqlens, outs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(outs, eager_outs)
    assert torch.equal(graph_cache[0], eager_cache[0]) and torch.equal(graph_cache[1], eager_cache[1])
    if leftpad:  # other pad counts written into the captured tensor: the replay reads them
        case.leftpad.copy_(torch.tensor([90, 0], dtype=torch.int32))
        eager_cache = case.caches(True)
        loop(*eager_cache, case.seqlens.clone(), eager_outs)
        for dst, src in zip(graph_cache[:2], case.caches(True)[:2]):
            dst.copy_(src)
        seqlens.copy_(case.seqlens)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(outs, eager_outs) and not torch.equal(outs[0], eager_first)


def plans() -> int:
    return diyflash.cache_info()["kv-cache plans"]


def kept() -> tuple[int, int]:
    """(kept decode buffers, their bytes), as diyflash.cache_info() counts them."""
    info = diyflash.cache_info()
    return info["kept decode buffers"], info["kept decode bytes"]


@pytest.mark.skipif(not ON_GPU, reason="the partials are kept for CUDA streams only (the interpreter's are per call)")
def test_split_partials_are_kept_per_stream(device):
    """Split-KV's partials live in buffers kept per (device, stream, thread) between eager calls: calls of
    other shapes and split counts in a row share them (growing them where needed), each bit-identical to the
    same call with fresh buffers. A call on another stream gets buffers of its own, so does a call from
    another thread, and a captured call its graph's own (the kept ones are not touched)."""
    diyflash.clear_caches()
    cases = [(KVCase(device=device, seed=0), 4), (KVCase(b=2, h=8, h_kv=8, lens=(100, 5), device=device, seed=1), 7),
             (KVCase(n_q=3, n_new=3, device=device, seed=2), 2), (KVCase(d=64, dv=32, device=device, seed=3), 33),
             (KVCase(device=device, seed=0), 4)]

    def call(case, splits):
        k_cache, v_cache, _ = case.caches(False)
        return diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, case.k, case.v,
                                                     causal=True, num_splits=splits,
                                                     sinks=torch.zeros(case.h, device=device), return_lse=True)

    results = [call(case, splits) for case, splits in cases]
    count, size = kept()
    # the out and lse partials, fp32, each as large as the largest call's: (B, H, N_q, splits, D_v), (.., splits),
    # and the merge's int32 counters, one a (batch, kv head, row tile) of a merging call (every case here has one
    # row tile; 33 splits are merged by the combine kernel)
    out_numel, lse_numel = (max(c.b * c.h * c.n_q * s * (c.dv if d else 1) for c, s in cases) for d in (True, False))
    from diyflash.kernels.attention.kvcache import MERGE_MAX_SPLITS

    tiles = max(c.b * c.h_kv for c, s in cases if s <= MERGE_MAX_SPLITS)
    assert count == 3 and size == 4 * (out_numel + lse_numel + tiles)
    for (case, splits), (out, lse) in zip(cases, results):
        diyflash.clear_caches()
        fresh_out, fresh_lse = call(case, splits)
        assert torch.equal(out, fresh_out) and torch.equal(lse, fresh_lse)
    for case, splits in cases:
        call(case, splits)
    assert kept() == (count, size)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out, lse = call(*cases[0])
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    count_side, size_side = kept()
    assert count_side == 6 and size_side > size  # the side stream's own partials and counters (case 0 merges)
    outs = []
    worker = threading.Thread(target=lambda: outs.append(call(*cases[0])))
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert torch.equal(outs[0][0], results[0][0]) and torch.equal(outs[0][1], results[0][1])
    count_thread, size_thread = kept()
    assert count_thread == 9 and size_thread - size_side == size_side - size  # the thread's own three
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call(*cases[0])
    graph.replay()
    torch.cuda.synchronize()
    assert kept() == (count_thread, size_thread)
    assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    for case, splits in cases:  # the main stream's buffers were left as they were: nothing grows
        call(case, splits)
    assert kept() == (count_thread, size_thread)


@pytest.mark.skipif(not ON_GPU, reason="CUDA-graph trees need a GPU")
def test_reduce_overhead_compile_of_a_split_decode_step(device):
    """torch.compile(mode="reduce-overhead") (CUDA-graph trees, as transformers' static cache generates)
    of a split-KV decode step writing into static caches: the warmup runs the op eagerly with allocations
    routed to the graphs' pool, which must hold no buffer beyond the call, so calls through the op keep
    none (a kept partials buffer made the tree refuse: "tensor(s) in the cudagraph pool not tracked as
    outputs"). Warmup, recording and replays on new values equal the eager steps, outputs and caches, and
    the step is not kept out of CUDA graphs."""
    from torch._dynamo.utils import counters

    diyflash.clear_caches()  # a kept buffer already big enough would hide an allocation
    torch._dynamo.reset()
    counters.clear()
    case = KVCase(b=2, h=8, h_kv=2, lens=(100, 37), capacity=256, d=64, dtype=torch.bfloat16, device=device)
    graph_cache, eager_cache = case.caches(False)[:2], case.caches(False)[:2]
    for t in graph_cache:
        torch._dynamo.mark_static_address(t)

    def step(q, k, v, k_cache, v_cache, seqlens):
        return diyflash.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k, v, causal=True, num_splits=4)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):  # warmup, recording, replays
        q, k, v = (seeded_randn(t.shape, t.dtype, device, 20 + 3 * i + j) for j, t in enumerate((case.q, case.k, case.v)))
        seqlens = case.seqlens + i
        got = compiled(q, k, v, *graph_cache, seqlens).clone()
        assert kept()[0] == 0
        want = step(q, k, v, *eager_cache, seqlens)  # the eager API's shortcut keeps its scratch
        assert kept()[0] > 0
        diyflash.clear_caches()
        assert torch.equal(got, want)
    assert torch.equal(graph_cache[0], eager_cache[0]) and torch.equal(graph_cache[1], eager_cache[1])
    assert counters["inductor"]["cudagraph_skips"] == 0
    torch._dynamo.reset()


@pytest.mark.skipif(not ON_GPU, reason="the scratch lse is kept for CUDA streams only")
@pytest.mark.parametrize("splits", [1, 4])
def test_an_lse_nobody_asked_for_goes_to_a_kept_buffer(device, splits):
    """Without return_lse, an eager call's lse is written to a kept scratch buffer instead of a fresh
    tensor (one allocation less a decode step): the output is bit-identical to the call with return_lse,
    for flash_attention_with_kvcache and for the dense API's decode route (a q of one row)."""
    diyflash.clear_caches()
    case = KVCase(device=device)
    k_cache, v_cache, _ = case.caches(False)
    out, _ = diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, causal=True,
                                                   num_splits=splits, return_lse=True)
    partials = kept()[0]  # 3 with splits (the partials and the merge's counters), else 0: no lse kept
    assert partials == (3 if splits > 1 else 0)
    alone = diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, causal=True,
                                                  num_splits=splits)
    assert kept()[0] == partials + 1  # the scratch lse
    assert torch.equal(alone, out)
    diyflash.clear_caches()
    with torch.no_grad():
        dense, lse = diyflash.flash_attention(case.q, k_cache, v_cache, causal=True, return_lse=True)
        partials = kept()[0]
        assert torch.equal(diyflash.flash_attention(case.q, k_cache, v_cache, causal=True), dense)
        assert kept()[0] == partials + 1


@pytest.mark.skipif(not ON_GPU, reason="plans bind compiled kernels; the interpreter has none")
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("splits", [1, 4])
def test_repeated_calls_replay_their_plan(device, monkeypatch, paged, splits):
    """An eager decode loop's host cost (issue 25): a call with the layouts of an earlier one replays
    that call's bound launches (append, decode, combine) with the new pointers. Bit-identical to the
    same call planned afresh, for other q, new keys, lengths and caches of the same layouts."""
    from diyflash.kernels.attention import kvcache as kv

    replays = []
    real = kv.replay_with
    monkeypatch.setattr(kv, "replay_with", lambda plan, env, args: replays.append(1) or real(plan, env, args))
    diyflash.clear_caches()
    first, second = KVCase(n_new=2, device=device, seed=0), KVCase(n_new=2, lens=(3, 50, 7), device=device, seed=10)

    def call(case):
        k_cache, v_cache, table = case.caches(paged)
        out, lse = diyflash.flash_attention_with_kvcache(case.q, k_cache, v_cache, case.seqlens, case.k, case.v,
                                                         block_table=table, causal=True, num_splits=splits,
                                                         return_lse=True)
        return out, lse, k_cache, v_cache

    call(first)
    assert plans() == 1 and not replays
    replayed = call(second)
    assert replays == [1]
    diyflash.clear_caches()
    fresh = call(second)
    assert replays == [1] and plans() == 1  # planned afresh, not replayed
    for a, b in zip(replayed, fresh):
        assert torch.equal(a, b)


@pytest.mark.skipif(not ON_GPU, reason="plans bind compiled kernels; the interpreter has none")
@pytest.mark.parametrize("window", [(-1, -1), (40, 0)])
def test_a_growing_cache_replays_the_plan_of_its_length_class(device, monkeypatch, window):
    """transformers' DynamicCache hands each decode step a contiguous cache one token longer (new length,
    new strides): the dense route's call then replays an earlier call's kernels with its own arguments
    where the lengths and strides have the classes Triton compiled for (not across a multiple of 16) and
    the split count is the same. Bit-identical to the same call planned afresh, and right by the oracle.
    The replays are Python's here (the C++ module off, so the count does not depend on whether its build
    finished): tests/test_cplan.py checks the C++ call's growing cache."""
    from diyflash.kernels import _cplan
    from diyflash.kernels.attention import kvcache as kv

    before = _cplan.use(False)
    try:
        _growing_cache_replays(device, monkeypatch, window, kv)
    finally:
        _cplan.use(before)


def _growing_cache_replays(device, monkeypatch, window, kv):
    replays = []
    real = kv.replay_with
    monkeypatch.setattr(kv, "replay_with", lambda plan, env, args: replays.append(1) or real(plan, env, args))
    q = seeded_randn((2, 8, 1, 64), torch.bfloat16, device, 0)
    keys = seeded_randn((2, 2, 560, 64), torch.bfloat16, device, 1)
    values = seeded_randn((2, 2, 560, 64), torch.bfloat16, device, 2)
    lengths = (520, 521, 530, 528, 529, 540)  # 528 = 33 * 16: another class; 4 splits throughout

    def step(n):
        return diyflash.flash_attention(q, keys[:, :, :n].contiguous(), values[:, :, :n].contiguous(), causal=True,
                                        window_size=window)

    diyflash.clear_caches()
    grown = [step(n) for n in lengths]
    assert len(replays) == 4 and plans() == 2  # 520 and 528 plan, the others replay
    for n, out in zip(lengths, grown):
        diyflash.clear_caches()
        assert torch.equal(out, step(n))
        k, v = keys[:, :, :n], values[:, :, :n]
        ref, _ = attention_ref(q, k, v, True, window_size=window)
        plain, _ = attention_ref(q, k, v, True, upcast=False, window_size=window)
        report = error_report(f"out at {n} keys", out, ref, plain)
        assert report.ok, str(report)


@pytest.mark.parametrize("window, softcap", [((-1, -1), 0.0), ((40, 0), 0.0), ((1100, 0), 0.0), ((-1, -1), 30.0)])
def test_a_grown_decode_call_keeps_the_plan_exactly_where_the_plan_key_is_the_same(monkeypatch, window, softcap):
    """FastKV.grown (a decode step's first call, on caches one token longer than the step before's) compares what
    depends on the caches' length instead of computing the plan key: it takes the step before's plan exactly
    where kvcache._kv_key is the same, over lengths whose ints change class (multiples of 16), whose split count
    changes (a 132-SM grid, 100-key splits here so that a split count changes where no int changes class), past
    a left window's width, and where the step before merged its splits and this one's stream is captured; and runs
    it with its own call's launch scalars; with the caller's family (FastKV.join), the plan of an earlier length of
    the same key, back across a multiple of 16. A FastKV without a C++ call, or with TMA descriptors, grows none."""
    from types import SimpleNamespace

    from diyflash.kernels.attention import kvcache as kv

    monkeypatch.setattr(kv, "device_limits", lambda device: SimpleNamespace(sms=132))
    monkeypatch.setattr(kv, "INTERPRETED", False)  # (_kv_key has no key under the interpreter)
    monkeypatch.setattr(kv, "MIN_KEYS_PER_SPLIT", 100)  # split counts that change where no int changes class
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    stream = {"keep": None}  # what _keeps answers: None, as for a CPU tensor or a stream being captured
    monkeypatch.setattr(kv, "_keeps", lambda q: stream["keep"])
    q = torch.randn(1, 8, 1, 64)
    scale, out_strides = 0.125, kv.empty_out(q, 64).stride()

    def call(n):
        k = torch.empty(1, 2, n, 64)
        layout = kv._call_layout(q, k, k, None, None, None, True, scale, window, softcap, None, 0, out_strides,
                                 kv._keeps(q))
        return k, layout, kv._kv_key(q, k, k, layout, (None,) * 7, scale, 0, False)

    program = (object(), kv._NO_INDEXES)

    def made(layout, key):  # what fast_kvcache answers for a call of this layout: a FastKV of the key's plan
        fast = kv.FastKV(SimpleNamespace(descs=(), key=key), layout, 64, False, 0, ())
        fast.program = program
        return fast

    _, before, before_key = call(1000)
    family = {}
    made(before, before_key).join(family)
    same = kept = 0
    for n in range(1001, 1301):
        k, layout, key = call(n)
        fast = made(before, before_key)
        grown = fast.grown(q, k, k, True, window, {})
        assert (grown is not None) == (key == before_key), n
        if grown is not None:
            assert grown.plan is fast.plan and grown.program is program and grown.values == layout.args
            same += 1
        # with the caller's family: the plan of the key wherever an earlier length of the key made one
        grown = fast.grown(q, k, k, True, window, family)
        known = any(f.plan.key == key for f in family.values())
        assert (grown is not None) == known, n
        if grown is not None:
            assert grown.plan.key == key and grown.values == layout.args and grown.kin == made(layout, key).kin
            kept += 1
        else:
            made(layout, key).join(family)
        before, before_key = layout, key
    assert 200 < same < kept < 300  # (most steps keep their plan; the family keeps those of the classes left)
    k, captured, _ = call(1001)
    stream["keep"] = ("a stream", 0, 0)  # an eager call's: its splits merged in the decode launch
    _, merged, _ = call(1001)
    assert merged.merge and not captured.merge and merged.splits == captured.splits
    stream["keep"] = None  # the step before's merged; this one's stream is being captured
    plan = SimpleNamespace(descs=())
    fast = kv.FastKV(plan, merged, 64, False, 0, ())
    fast.program = program
    assert fast.grown(q, k, k, True, window, {}) is None
    fast = kv.FastKV(plan, captured, 64, False, 0, ())
    fast.program = program
    assert fast.grown(q, k, k, True, window, {}) is not None
    fast.program = False  # (no C++ call)
    assert fast.grown(q, k, k, True, window, {}) is None
    fast.program, fast.plan = program, SimpleNamespace(descs=("k",))
    assert fast.grown(q, k, k, True, window, {}) is None


def test_split_count_and_stages_fill_whole_waves(monkeypatch):
    """The launch shape rule (kvcache.py, measured in bench/results/decode_probe_h200.txt): a grid smaller
    than the GPU is split into one whole wave of programs, one an SM (four for a paged cache, whose
    block-table loads need the company), never below MIN_KEYS_PER_SPLIT keys a split, at most MAX_SPLITS; an
    unsplit grid of more than two programs an SM pipelines 2 stages deep (three programs an SM), any other 3."""
    from types import SimpleNamespace

    from diyflash.kernels.attention import kvcache as kv

    monkeypatch.setattr(kv, "device_limits", lambda device: SimpleNamespace(sms=132))
    monkeypatch.setattr(kv, "INTERPRETED", False)
    cuda = torch.device("cuda", 0)
    assert kv.num_splits_for(1, 8, 1, 65536, cuda) == 16  # 128 programs: one wave
    assert kv.num_splits_for(1, 8, 1, 65536, cuda, paged=True) == 64  # 66 for four an SM, MAX_SPLITS
    assert kv.num_splits_for(8, 8, 1, 65536, cuda, paged=True) == 8  # 512: four an SM (floor)
    assert kv.num_splits_for(1, 8, 1, 4096, cuda, paged=True) == 32  # 128 keys a split
    assert kv.num_splits_for(8, 8, 1, 8192, cuda) == 2  # not 5 (320 programs: a partial second wave)
    assert kv.num_splits_for(1, 8, 1, 1024, cuda) == 8  # 128 keys a split
    assert kv.num_splits_for(1, 8, 1, 200, cuda) == 1
    assert kv.num_splits_for(32, 8, 1, 2048, cuda) == 1  # the grid fills the GPU
    assert kv.decode_stages(512, 1, cuda) == 2 and kv.decode_stages(264, 1, cuda) == 3
    assert kv.decode_stages(64, 5, cuda) == 3
