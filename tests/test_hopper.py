"""The Hopper forward (kernels/attention/forward_sm90.py, a warp-specialized Gluon kernel): where it runs, that
it computes the portable kernels' semantics, and that everything else falls back to them.

CPU (CI): the fallback when Gluon is missing or untested, the backend switch (the sm_90a builds themselves:
test_hopper_builds.py). GPU (an H100/H200): every case on both
backends under the 2x rule against the float64 oracle, which kernel each call ran, scores whose raw dot overflows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import diyflash
from diyflash.kernels.attention import hopper
from diyflash.kernels.contract import few_query_rows, mean_keys, variant
from diyflash.reference import attention_ref
from diyflash.utils.validation import error_report
from helpers import ON_GPU, hopper_here, kernels_run, make_qkv, sink_logits, slopes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Compiled in a fresh process without TRITON_INTERPRET (the suite's CPU run interprets): sm_90a, no GPU needed
def _triton_has_gluon_hopper() -> bool:
    return not isinstance(hopper.kernel_module(), str)


try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton: the test below skips
    triton = None

if triton is not None:
    from diyflash.kernels.attention.semantics import _fma_marked, _mul_exact, _online_softmax, _online_softmax_fma

    @triton.jit
    def _softmax_forms(qk_ptr, vis_ptr, out_ptr, mark_ptr, qk_scale):
        """Two key blocks of a (16, 32) raw q.k tile through semantics' online softmax in both forms: the
        exact one on the rounded scores, and _online_softmax_fma (the Hopper forward's) on the raw dots; keys
        not visible at -inf in both."""
        rows = tl.arange(0, 16)[:, None]
        cols = tl.arange(0, 32)[None, :]
        m_e = tl.full([16], float("-inf"), tl.float32)
        l_e = tl.zeros([16], tl.float32)
        m_f = tl.full([16], float("-inf"), tl.float32)
        l_f = tl.zeros([16], tl.float32)
        top = tl.zeros([16], tl.float32)
        for blk in tl.static_range(2):
            qk = tl.load(qk_ptr + blk * 512 + rows * 32 + cols)
            vis = tl.load(vis_ptr + blk * 512 + rows * 32 + cols) != 0
            s = tl.where(vis, _mul_exact(qk, qk_scale), float("-inf"))
            p_e, a_e, _g, m_e, l_e = _online_softmax(s, m_e, l_e, MASKED=True, LAZY=False)
            p_f, a_f, m_f, l_f, reach = _online_softmax_fma(tl.where(vis, qk, float("-inf")), m_f, l_f, qk_scale,
                                                            MASKED=True)
            top = tl.maximum(top, reach)
            tl.store(out_ptr + blk * 1024 + rows * 32 + cols, p_e)
            tl.store(out_ptr + blk * 1024 + 512 + rows * 32 + cols, p_f)
        tl.store(out_ptr + 2048 + tl.arange(0, 16), m_e)
        tl.store(out_ptr + 2064 + tl.arange(0, 16), l_e)
        tl.store(out_ptr + 2080 + tl.arange(0, 16), m_f)
        tl.store(out_ptr + 2096 + tl.arange(0, 16), l_f)
        marked = _fma_marked(tl.zeros([16], tl.float32), top)  # NaN where the row is marked
        tl.store(mark_ptr + tl.arange(0, 16), (marked != marked).to(tl.int32))


@pytest.mark.parametrize("big", [0.0, 2.0**20, -2.0**21, float("inf")])
def test_fma_softmax_agrees_and_marks_the_rows_it_cannot_take(device, big):
    """_online_softmax_fma (the Hopper forward's form) against the exact form over two key blocks: rows that
    see no key in the first block (-inf, no NaN), in neither (p 0, l 0), masked keys, and one row whose max
    reaches 2^20 in base-2 units (or +inf: a raw dot that overflowed) or whose every score is below -2^20 (here
    -2^21 + noise), which _fma_marked must mark (and only it) for the exact form's second pass; the other rows
    agree with the exact form (p and l to an fp32 rounding of the score, m bit for bit), and no row is marked
    where every row is moderate."""
    if triton is None:
        pytest.skip("triton is not installed")
    gen = torch.Generator().manual_seed(0)
    qk = (torch.randn(2, 16, 32, generator=gen) * 20).float()
    vis = torch.rand(2, 16, 32, generator=gen) > 0.3
    vis[0, 3] = False  # row 3 sees no key in the first block
    vis[:, 5] = False  # row 5 sees none at all
    scale = 0.125 * 1.4426950408889634
    if big > 0:  # one key of row 9 far above the others (+inf: its raw dot overflowed)
        qk[1, 9, 4] = big / scale
        vis[1, 9, 4] = True
    elif big < 0:  # every key of row 9 far below zero
        qk[:, 9] += big / scale
    out = torch.empty(2112, device=device)
    marks = torch.zeros(16, dtype=torch.int32, device=device)
    _softmax_forms[(1,)](qk.to(device), vis.to(torch.int32).to(device), out, marks, scale)
    out = out.cpu()
    p = out[:2048].view(2, 2, 16, 32)  # (block, form, row, key)
    m_e, l_e, m_f, l_f = out[2048:].view(4, 16)
    assert marks.cpu().nonzero().flatten().tolist() == ([9] if big else []), marks
    assert (p[:, :, 5] == 0).all() and l_e[5] == 0 and l_f[5] == 0 and m_e[5] == m_f[5] == float("-inf")
    assert (p[0, :, 3] == 0).all()
    keep = torch.ones(16, dtype=torch.bool)
    if big:
        keep[9] = False  # the marked row: the exact form takes it
    assert not any(t.isnan().any() for t in (p[:, :, keep], m_f[keep], l_f[keep]))
    assert torch.equal(m_e[keep], m_f[keep])  # the max of the rounded scores, either way
    torch.testing.assert_close(p[:, 1][:, keep], p[:, 0][:, keep], rtol=2e-6, atol=0)
    torch.testing.assert_close(l_f[keep], l_e[keep], rtol=2e-6, atol=0)


def test_fallback_without_gluon(monkeypatch):
    """No Gluon Hopper API (an older Triton), or a Triton this kernel was not checked with: the module says
    why, and no call routes to it."""
    import triton

    monkeypatch.setitem(sys.modules, "triton.experimental.gluon.language.nvidia.hopper", None)
    monkeypatch.delitem(sys.modules, "diyflash.kernels.attention.forward_sm90", raising=False)
    monkeypatch.delattr(diyflash.kernels.attention, "forward_sm90", raising=False)
    hopper.kernel_module.cache_clear()
    hopper._device_status.cache_clear()
    try:
        why = hopper.kernel_module()
        assert isinstance(why, str) and "Gluon Hopper API is missing" in why, why
        hopper.backward_module.cache_clear()
        assert hopper.backward_module() == why  # the backward needs the same API
        monkeypatch.undo()
        hopper.kernel_module.cache_clear()
        monkeypatch.setattr(triton, "__version__", "3.7.0")
        why = hopper.kernel_module()
        assert isinstance(why, str) and "3.7.0" in why and "DIYFLASH_ATTENTION_BACKEND=hopper" in why, why
        if ON_GPU:  # the device's status carries the reason, and calls take the portable kernel
            hopper._device_status.cache_clear()
            assert hopper.status(torch.device("cuda")) == (False, why)
            q, k, v = make_qkv(1, 2, 256, 256, 128, torch.bfloat16)
            assert _kernels_run(lambda: diyflash.flash_attention(q, k, v)) == {"portable"}
    finally:
        monkeypatch.undo()
        hopper.kernel_module.cache_clear()
        hopper.backward_module.cache_clear()
        hopper._device_status.cache_clear()
        diyflash.clear_caches()


def test_backend_switch():
    with pytest.raises(ValueError, match="backend='cudnn'"):
        hopper.use("cudnn")
    before = hopper.backend()
    try:
        hopper.use("portable")
        assert hopper.status(torch.device("cuda"))[1] == "DIYFLASH_ATTENTION_BACKEND=portable"
        q, k, v = make_qkv(1, 2, 128, 128, 128)
        assert hopper.tiles(q, k, v, None, None, None, None, False, lambda: True) is None
    finally:
        hopper.use(before)
    env = dict(os.environ, DIYFLASH_ATTENTION_BACKEND="fast")
    run = subprocess.run([sys.executable, "-c", "import diyflash.kernels.attention"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "DIYFLASH_ATTENTION_BACKEND='fast'" in run.stderr, run.stderr[-2000:]


# -- the GPU suite --

needs_hopper = pytest.mark.skipif(not hopper_here(), reason="needs an sm_90 GPU with Triton's Gluon Hopper API")


def _kernels_run(call) -> set[str]:
    """Which forward kernels a call launched ({"hopper", "portable"})."""
    return kernels_run(call, "_hopper_fwd_kernel", "_attn_fwd_kernel")


# A call the Hopper forward takes launches it and the portable kernel's second pass (PASS 2), which computes again
# the blocks with a row the Hopper kernel marked (semantics._fma_marked) and returns at once elsewhere
HOPPER_RUN = {"hopper", "portable"}


CASES = [  # (B, H, H_kv, N_q, N_k, D, causal, window, softcap)
    (2, 4, 2, 1000, 1000, 128, True, (-1, -1), 0.0),
    (2, 4, 2, 1000, 1000, 128, False, (-1, -1), 0.0),
    (1, 8, 1, 300, 1000, 128, True, (-1, -1), 0.0),  # N_q < N_k, GQA 8
    (1, 2, 2, 1023, 300, 128, True, (-1, -1), 0.0),  # rows that see no key
    (2, 4, 4, 113, 17, 64, True, (-1, -1), 0.0),
    (2, 4, 1, 1024, 1024, 64, False, (-1, -1), 0.0),  # GQA 4
    (1, 4, 2, 1000, 1000, 64, True, (300, 0), 30.0),  # D64's three consumers: a window, softcap, a partial block
    (1, 4, 2, 700, 1000, 64, True, (-1, -1), 0.0),  # D64 causal, N_q < N_k: each consumer's own band of blocks
    (2, 2, 2, 1000, 1000, 64, True, (100, 0), 0.0),  # a window narrower than a tile: the consumers' bands apart
    (1, 4, 1, 1500, 1500, 128, True, (256, 0), 30.0),  # a causal window with softcap
    (1, 4, 2, 2500, 2500, 128, True, (1000, 0), 0.0),  # a window long enough for D128's 128-key blocks
    (1, 4, 1, 17, 113, 128, False, (20, 7), 0.0),
    (1, 2, 2, 1, 1023, 128, False, (-1, -1), 0.0),
]


def case_id(case) -> str:
    """A case's test id, its shape spelled out (an index into a filtered list names nothing)."""
    b, h, h_kv, n_q, n_k, d, causal, window, softcap = case
    return (f"B{b}H{h}kv{h_kv}-{n_q}x{n_k}-D{d}" + ("-causal" if causal else "")
            + (f"-win{window[0]},{window[1]}" if window != (-1, -1) else "") + (f"-cap{softcap:g}" if softcap else ""))


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_both_backends_within_2x(backend, case, dtype):
    b, h, h_kv, n_q, n_k, d, causal, window, softcap = case
    q = make_qkv(b, h, n_q, n_q, d, dtype, seed=1)[0]
    k, v = make_qkv(b, h_kv, n_k, n_k, d, dtype, seed=2)[1:]
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    out, lse = diyflash.flash_attention(q, k, v, return_lse=True, **kw)
    ref, ref_lse = attention_ref(q, k, v, **kw)
    plain, plain_lse = attention_ref(q, k, v, upcast=False, **kw)
    seen = torch.isfinite(ref_lse)  # rows that see no key: lse -inf (and out 0) on both sides
    assert torch.equal(torch.isfinite(lse), seen) and (lse[~seen] == float("-inf")).all()
    for report in (error_report("out", out, ref, plain), error_report("lse", lse[seen], ref_lse[seen], plain_lse[seen])):
        assert report.ok, str(report)
    ran = _kernels_run(lambda: diyflash.flash_attention(q, k, v, **kw))
    hopper_here = backend == "hopper" and not few_query_rows(q.shape, k.shape)  # few rows: the decode kernel
    assert ("hopper" in ran) == hopper_here, ran


@needs_hopper
@pytest.mark.parametrize("case", [c for c in CASES if c[3] > 1], ids=case_id)
def test_persistent_programs_take_every_tile(fresh_caches, monkeypatch, case):
    """The persistent grid: one, three or five programs, each taking several tiles in turns (their rows, key
    blocks and slots' phases carried from tile to tile; causal tiles of unequal work, windows, rows that see
    no key, GQA), give the full grid's out and lse bit for bit, with head groups of one and of every head (the
    last round's tiles whole: a split one adds its pieces in another order, test_split_last_round_within_2x)."""
    b, h, h_kv, n_q, n_k, d, causal, window, softcap = case
    q = make_qkv(b, h, n_q, n_q, d, torch.bfloat16, seed=3)[0]
    k, v = make_qkv(b, h_kv, n_k, n_k, d, torch.bfloat16, seed=4)[1:]
    kw = dict(causal=causal, window_size=window, softcap=softcap, return_lse=True)
    hopper.use("hopper")
    try:
        assert "hopper" in _kernels_run(lambda: diyflash.flash_attention(q, k, v, **kw))
        full = diyflash.flash_attention(q, k, v, **kw)
        grids = []
        for programs in (1, 3, 5):
            for group in (1, 3, b * h):  # 3: a short last group where it does not divide the heads
                monkeypatch.setattr(hopper, "schedule", lambda tiles, bh, causal, device, n=programs, g=group: (
                    min(tiles * bh, n), min(g, bh) if causal else 1))
                monkeypatch.setattr(hopper, "split", lambda *args: None)  # whole tiles (split: the test below)
                diyflash.clear_caches()  # the plans bound the grid and groups of before
                grids.append(diyflash.flash_attention(q, k, v, **kw))
        for out, lse in grids:
            assert torch.equal(out, full[0]) and torch.equal(lse, full[1])
    finally:
        hopper.use("auto")


SPLIT_CASES = [c for c in CASES if not c[6] and c[7] == (-1, -1) and c[3] > 1] + [
    (1, 3, 1, 777, 1000, 128, False, (-1, -1), 0.0),  # GQA 3, N_q != N_k, a partial key block
    (2, 3, 3, 500, 900, 64, False, (-1, -1), 0.0),  # D64's three consumers in turns, a partial key block
]


def _force_split(monkeypatch, programs: int) -> None:
    """`programs` persistent programs, and the last round split whatever it saves (hopper.split's rule aside)."""
    monkeypatch.setattr(hopper, "schedule", lambda tiles, bh, causal, device: (min(tiles * bh, programs), 1))
    monkeypatch.setattr(hopper, "SPLIT_MIN_GAIN", -100.0)
    diyflash.clear_caches()  # the plans bound the grid of before


@needs_hopper
@pytest.mark.parametrize("case", SPLIT_CASES, ids=case_id)
def test_split_last_round_within_2x(fresh_caches, monkeypatch, case):
    """The last round of tiles cut into runs of key blocks (hopper.split, tile_order._work) whose pieces the
    merge launch adds up (merge.py): on three counts of programs, out and lse within the 2x rule of float64 and
    within fp32 rounding of the whole tiles' grid; the merge ran; the kept plan's replays, through the API's
    fast path (its C++ call included), give the first call's bits."""
    b, h, h_kv, n_q, n_k, d, causal, window, softcap = case
    q = make_qkv(b, h, n_q, n_q, d, torch.bfloat16, seed=7)[0]
    k, v = make_qkv(b, h_kv, n_k, n_k, d, torch.bfloat16, seed=8)[1:]
    kw = dict(causal=causal, window_size=window, softcap=softcap, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, causal=causal, window_size=window, softcap=softcap)
    plain, plain_lse = attention_ref(q, k, v, upcast=False, causal=causal, window_size=window, softcap=softcap)
    hopper.use("hopper")
    try:
        whole = diyflash.flash_attention(q, k, v, **kw)
        tiles = hopper.head_dim_tiles(d, False)
        total = -(-n_q // tiles.block_m) * b * h
        for programs in [p for p in (3, 5, 7, 11, 13) if total % p][:3]:  # a last round part full
            _force_split(monkeypatch, programs)
            assert hopper.split(-(-n_q // tiles.block_m), b * h, -(-n_k // tiles.block_n), programs, False)
            assert kernels_run(lambda: diyflash.flash_attention(q, k, v, **kw), "_hopper_fwd_kernel",
                               "_attn_merge_pieces_kernel") == {"hopper", "portable"}
            out, lse = diyflash.flash_attention(q, k, v, **kw)
            for report in (error_report("out", out, ref, plain), error_report("lse", lse, ref_lse, plain_lse)):
                assert report.ok, f"{programs} programs: {report}"
            torch.testing.assert_close(out, whole[0], atol=2**-7, rtol=0)  # one bf16 rounding apart at most
            torch.testing.assert_close(lse, whole[1], atol=1e-5, rtol=1e-5)
            for _ in range(3):  # the plan, then the fast path's kept call
                again = diyflash.flash_attention(q, k, v, **kw)
                assert torch.equal(again[0], out) and torch.equal(again[1], lse)
    finally:
        hopper.use("auto")


@needs_hopper
def test_split_pieces_keep_the_marks(fresh_caches, monkeypatch):
    """A row the Hopper forward marks (a NaN lse: semantics._fma_marked) in one piece of a split tile stays marked
    through the merge (semantics._merge_rows' MARKS), so the second pass computes it again: rows 300-309 see key 5
    far above the rest, out = v[5] exactly, every row finite."""
    q, k, v = make_qkv(1, 2, 1000, 1000, 128, torch.float16, seed=5)
    q[:, :, 300:310] = 2e4
    k[:, :, 5] = 2e4
    hopper.use("hopper")
    try:
        _force_split(monkeypatch, 3)
        assert kernels_run(lambda: diyflash.flash_attention(q, k, v), "_hopper_fwd_kernel",
                           "_attn_merge_pieces_kernel") == {"hopper", "portable"}
        out, lse = diyflash.flash_attention(q, k, v, return_lse=True)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        torch.testing.assert_close(out[:, :, 300:310].float(), v[:, :, 5:6].float().expand(1, 2, 10, 128), atol=0,
                                   rtol=0)
        torch.testing.assert_close(out.double(), attention_ref(q, k, v)[0], atol=3e-2, rtol=0)
    finally:
        hopper.use("auto")


# The forward's schedule switches, each forced on and off: TURNS (hopper.Tiles.turns: the consumers issue their
# matmuls in turns, FA3's ping-pong) on every case of more than one query row, banded ones included (there the
# consumers pass blocks outside their own band and take those blocks' turns too, or the ring would hang); SERIAL
# (hopper.Tiles.serial: a block's softmax after its p @ v as well, only the mask behind the block's branch) on
# every banded case, softcap included (its product rounded on its own: semantics._softcap).
SWITCH_CASES = ([("TURNS", torch.float16, c) for c in CASES if c[3] > 1]
                + [("SERIAL", torch.bfloat16, c) for c in CASES if c[6] or c[7] != (-1, -1)])


@needs_hopper
@pytest.mark.parametrize("switch, dtype, case", SWITCH_CASES,
                         ids=[f"{sw}-{case_id(c)}" for sw, _, c in SWITCH_CASES])
def test_schedule_switches_change_no_bit(fresh_caches, monkeypatch, switch, dtype, case):
    """A schedule switch orders the consumers' work, not what they compute: the case with it forced off and on,
    at both head dims, gives the same out and lse bit for bit."""
    b, h, h_kv, n_q, n_k, d, causal, window, softcap = case
    q = make_qkv(b, h, n_q, n_q, d, dtype, seed=5)[0]
    k, v = make_qkv(b, h_kv, n_k, n_k, d, dtype, seed=6)[1:]
    kw = dict(causal=causal, window_size=window, softcap=softcap, return_lse=True)
    meta = hopper.Tiles.meta
    hopper.use("hopper")
    try:
        runs = []
        for on in (False, True):
            monkeypatch.setattr(hopper.Tiles, "meta",
                                lambda self, n_k, banded, on=on: {**meta(self, n_k, banded), switch: on})
            diyflash.clear_caches()  # the plans bound the kernel of before
            assert "hopper" in _kernels_run(lambda: diyflash.flash_attention(q, k, v, **kw))
            runs.append(diyflash.flash_attention(q, k, v, **kw))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    finally:
        monkeypatch.undo()
        hopper.use("auto")


@needs_hopper
def test_bnhd_and_sliced_views(fresh_caches):
    """Strided views read in place through the host descriptors, bitwise as contiguous copies; a tensor TMA
    cannot read (its base not 16-byte aligned) takes the portable kernel."""
    hopper.use("hopper")
    try:
        for layout in ("bnhd", "sliced"):
            q, k, v = make_qkv(2, 4, 512, 512, 128, torch.bfloat16, layout=layout)
            ref = diyflash.flash_attention(*(t.contiguous() for t in (q, k, v)), causal=True)
            assert _kernels_run(lambda: diyflash.flash_attention(q, k, v, causal=True)) == HOPPER_RUN
            assert torch.equal(diyflash.flash_attention(q, k, v, causal=True), ref), layout
        q, k, v = make_qkv(1, 2, 256, 256, 128, torch.float16)
        shifted = torch.empty(q.numel() + 8, dtype=q.dtype, device=q.device)[1:q.numel() + 1].view_as(q)
        shifted.copy_(q)
        assert _kernels_run(lambda: diyflash.flash_attention(shifted, k, v)) == {"portable"}
    finally:
        hopper.use("auto")


@needs_hopper
def test_what_falls_back_to_portable(fresh_caches):
    """Calls the Hopper kernel does not take run the portable one, and only it; softcap's take the Hopper kernel
    alone (the exact form: no marked rows, no second pass)."""
    hopper.use("hopper")
    try:
        q, k, v = make_qkv(2, 4, 256, 256, 128, torch.bfloat16)
        assert _kernels_run(lambda: diyflash.flash_attention(q, k, v)) == HOPPER_RUN  # bf16 in one pass too
        q16, k16, v16 = (t.half() for t in (q, k, v))
        assert _kernels_run(lambda: diyflash.flash_attention(q16, k16, v16)) == HOPPER_RUN
        assert _kernels_run(lambda: diyflash.flash_attention(q16, k16, v16, softcap=30.0)) == {"hopper"}  # exact form
        lens = torch.tensor([200, 256], dtype=torch.int32, device="cuda")
        others = {
            "seq_lens": lambda: diyflash.flash_attention(q, k, v, seq_lens=lens),
            "alibi": lambda: diyflash.flash_attention(q, k, v, alibi_slopes=slopes(4, device="cuda")),
            "sinks": lambda: diyflash.flash_attention(q, k, v, sinks=sink_logits(4, device="cuda")),
            "fp32": lambda: diyflash.flash_attention(q.float(), k.float(), v.float()),
            "head_dim 80": lambda: diyflash.flash_attention(q[..., :80].contiguous(), k[..., :80].contiguous(),
                                                            v[..., :80].contiguous()),
            "Dv != D": lambda: diyflash.flash_attention(q, k, v[..., :64].contiguous()),
            "expanded k": lambda: diyflash.flash_attention(q, k[:, :1].expand(2, 4, 256, 128), v),
        }
        for name, call in others.items():
            assert _kernels_run(call) == {"portable"}, name
    finally:
        hopper.use("auto")


@needs_hopper
@pytest.mark.parametrize("d, causal, window, n, heads, takes", [
    (64, False, (-1, -1), 4096, 4, True), (64, True, (-1, -1), 4096, 4, True), (64, True, (-1, -1), 2048, 32, False),
    (64, True, (512, 0), 4096, 4, True), (64, True, (128, 0), 4096, 4, True), (64, True, (64, 0), 4096, 4, False),
    (64, False, (300, 300), 4096, 4, True),
    (128, True, (-1, -1), 4096, 4, True), (128, True, (64, 0), 4096, 4, True)])
def test_auto_takes_the_measured_calls(fresh_caches, d, causal, window, n, heads, takes):
    """"auto" runs the Hopper forward at the head dims of AUTO_MIN_KEYS where a query row sees that many
    keys on average: at D64 from 2048 (N 4096: 4096 keys a row, causal 2048.5; N 2048 causal 1024.5), with a
    sliding window from AUTO_MIN_WINDOW_KEYS' 120 (a 512-key causal window at N 4096: 481 keys a row; 128: 127;
    64: 64.5; 300 both sides: 579), at D128 from any."""
    q, k, v = make_qkv(1, heads, n, n, d, torch.float16)  # work >= 2^32: plans.HOST_DESC_MIN_WORK
    var = variant(causal, window, 0.0, n, n, heads, heads)
    need = (hopper.AUTO_MIN_WINDOW_KEYS if var.window else hopper.AUTO_MIN_KEYS)[d]
    assert var.window == (window != (-1, -1)) and (mean_keys(var, n, n) >= need) == takes
    ran = _kernels_run(lambda: diyflash.flash_attention(q, k, v, causal=causal, window_size=window))
    assert ran == (HOPPER_RUN if takes else {"portable"}), (d, causal, window, ran)


@needs_hopper
@pytest.mark.parametrize("d, window, n, block_n", [
    (128, (256, 0), 4096, 64), (128, (700, 0), 4096, 64), (128, (900, 0), 4096, 128), (128, (-1, -1), 4096, 128),
    (64, (2048, 0), 8192, 64), (64, (-1, -1), 4096, 128)])
def test_window_tiles_follow_the_keys_a_row_sees(fresh_caches, monkeypatch, d, window, n, block_n):
    """A causal call's forward tiles: a sliding window's 64-key blocks (hopper.WINDOW_TILES) where its rows see
    fewer keys than WINDOW_MAX_KEYS on average (D128: 768; a 700-key window at N 4096 about 640, a 900-key one
    about 801), at D64 on every window; the 128-key blocks of hopper.TILES without one."""
    q, k, v = make_qkv(1, 4, n, n, d, torch.bfloat16)
    taken = []
    route = hopper.tiles
    monkeypatch.setattr(hopper, "tiles", lambda *a, **kw: taken.append(route(*a, **kw)) or taken[-1])
    assert _kernels_run(lambda: diyflash.flash_attention(q, k, v, causal=True, window_size=window)) == HOPPER_RUN
    assert taken and {t.block_n for t in taken} == {block_n}, taken


@needs_hopper
def test_auto_leaves_short_calls_to_portable(fresh_caches):
    """A call with less work than plans.HOST_DESC_MIN_WORK runs the portable kernel under "auto" (its host
    time decides, and the Hopper kernel's host descriptors cost it), the Hopper kernel under "hopper"; the
    same result within the 2x rule either way."""
    q, k, v = make_qkv(1, 32, 128, 128, 128, torch.bfloat16)
    ref, plain = attention_ref(q, k, v, causal=True)[0], attention_ref(q, k, v, causal=True, upcast=False)[0]
    for backend, kernels in (("auto", {"portable"}), ("hopper", HOPPER_RUN)):
        hopper.use(backend)
        try:
            assert _kernels_run(lambda: diyflash.flash_attention(q, k, v, causal=True)) == kernels, backend
            report = error_report("out", diyflash.flash_attention(q, k, v, causal=True), ref, plain)
            assert report.ok, str(report)
        finally:
            hopper.use("auto")


@needs_hopper
@pytest.mark.parametrize("d", [64, 128])
def test_overflowed_rows_are_redone(backend, d):
    """bf16 scores whose raw q.k leaves fp32's range (scaled back into it by the scale): the Hopper kernel's
    prescaled q (PASS 3) and the portable second pass keep them finite; no NaN, within the 2x rule."""
    q, k, v = make_qkv(1, 2, 300, 300, d, torch.bfloat16, seed=3)
    q, k = q * 2.0**64, k * 2.0**64  # q.k ~ 2^128 * 10: past fp32's range
    q[:, :, 70:] /= 2.0**64  # rows from 70 on (the second 64-row block and later) stay in range
    scale = 2.0**-128 / d**0.5
    out = diyflash.flash_attention(q, k, v, causal=True, sm_scale=scale)
    ref = attention_ref(q, k, v, causal=True, scale=scale)[0]
    assert not out.isnan().any()
    # outputs are averages of v (|v| < 5): bf16's rounding of them is below 2^-8 * 5
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=0)


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_huge_rows_take_the_exact_form(fresh_caches, monkeypatch, d, dtype):
    """The Hopper forward folds the scale into exp2's FMA (semantics._online_softmax_fma), whose rounding
    against a row max of ~2^32 (base 2; scores of ~5e10 raw here) would overflow p or flush it to 0: it marks
    such rows (a NaN lse), the portable second pass computes their blocks again in the exact form, and every
    row is right (rows 300-309 see key 5 far above the rest: out = v[5]). One persistent program taking every
    tile gives the full grid's bits."""
    q, k, v = make_qkv(1, 2, 1000, 1000, d, dtype, seed=5)
    q[:, :, 300:310] = 2e4
    k[:, :, 5] = 2e4
    kw = dict(causal=True, return_lse=True)
    hopper.use("hopper")
    try:
        assert "hopper" in _kernels_run(lambda: diyflash.flash_attention(q, k, v, **kw))
        out, lse = diyflash.flash_attention(q, k, v, **kw)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        torch.testing.assert_close(out[:, :, 300:310].float(), v[:, :, 5:6].float().expand(1, 2, 10, d), atol=0, rtol=0)
        ref = attention_ref(q, k, v, causal=True)[0]
        torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=0)  # averages of |v| < 5 in 16 bits
        monkeypatch.setattr(hopper, "schedule", lambda tiles, bh, causal, device: (1, 1))
        diyflash.clear_caches()
        one = diyflash.flash_attention(q, k, v, **kw)
        assert torch.equal(one[0], out) and torch.equal(one[1], lse)
    finally:
        hopper.use("auto")


@needs_hopper
def test_plan_replay_and_compile_are_bitwise(fresh_caches):
    q, k, v = make_qkv(2, 4, 700, 700, 128, torch.bfloat16)
    first = diyflash.flash_attention(q, k, v, causal=True)
    again = diyflash.flash_attention(q, k, v, causal=True)  # the kept plan
    compiled = torch.compile(lambda q, k, v: diyflash.flash_attention(q, k, v, causal=True), fullgraph=True)(q, k, v)
    assert torch.equal(first, again) and torch.equal(first, compiled)


def test_the_toolkit_names_both_kernels(monkeypatch):
    """`python -m diyflash` says which kernels run the forward and the backward (ops.runtime.attention_backend):
    on an sm_90 device the Hopper ones and where, else the portable kernels and why."""
    from diyflash.ops.runtime import attention_backend

    device = torch.device("cuda")
    monkeypatch.setattr(hopper, "status", lambda device: (True, "Gluon, warp-specialized"))
    monkeypatch.setattr(hopper, "backward_module", lambda: object())
    assert attention_backend(device).startswith("hopper (Gluon")
    assert attention_backend(device, backward=True).startswith("hopper one-pass (Gluon")
    assert "head_dim 64/128 when not deterministic" in attention_backend(device, backward=True)
    monkeypatch.setattr(hopper, "backward_module", lambda: "no Gluon here")
    assert attention_backend(device, backward=True) == "portable Triton kernels (no Gluon here)"
    monkeypatch.setattr(hopper, "status", lambda device: (False, "not sm_90"))
    assert attention_backend(device, backward=True) == "portable Triton kernels (not sm_90)"


def test_backward_needs_the_tma_reduce(monkeypatch):
    """The backward's one Gluon op without a wrapper (the builder's TMA reduce) is checked at import: a Triton
    without it leaves the backward to the portable kernels, with the reason, and the forward as it was."""
    if not _triton_has_gluon_hopper():
        pytest.skip(f"this Triton has no usable Gluon Hopper API: {hopper.kernel_module()}")
    from triton._C.libtriton import gluon_ir

    monkeypatch.delattr(gluon_ir.GluonOpBuilder, "create_async_tma_reduce")
    monkeypatch.delitem(sys.modules, "diyflash.kernels.attention.backward_sm90", raising=False)
    monkeypatch.delattr(diyflash.kernels.attention, "backward_sm90", raising=False)
    hopper.backward_module.cache_clear()
    try:
        why = hopper.backward_module()
        assert isinstance(why, str) and "create_async_tma_reduce" in why, why
        assert not isinstance(hopper.kernel_module(), str)
    finally:
        monkeypatch.undo()
        hopper.backward_module.cache_clear()

