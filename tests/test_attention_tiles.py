"""Tile and addressing choices against each other and the float64 oracle: full blocks without masks,
row-offset and 32-bit addressing, TMA and host descriptors, lazy rescaling, 64-bit offsets and grid chunking give
the error rule's results, most of them the same bits as the plain path (the order tiles are taken in:
test_attention_schedule.py).

The same file runs on CPU (Triton interpreter, tiny shapes) and on CUDA (adds large shapes).
"""

import pytest
import torch

import diyflash
from diyflash.reference import attention_ref
from diyflash.utils.validation import attention_error_reports
from helpers import ON_GPU, check_attention, make_qkv, random_like


@pytest.mark.parametrize("n_q,n_k", [(256, 256), (128, 256), (256, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_full_blocks_skip_masks_bit_for_bit(device, causal, n_q, n_k):
    """Lengths that fill every tile take the kernels' EVEN_M / EVEN_N variants (no row or key masks, no
    key-length mask in the causal diagonal blocks, no masked loops where none is needed). seq_lens of
    the longer length forces the masked variants over the same blocks: out, lse, dq, dk and dv agree
    bit for bit. Every tile size of the tuned table is a multiple of 32, so 128 and 256 fill the tiles
    of every kernel; n_q != n_k moves the causal diagonal both ways (with n_q > n_k, rows that see no
    key)."""
    from diyflash.kernels.attention import launch as ka

    q, k, v = make_qkv(2, 2, n_q, n_k, 32, torch.float16, device)
    dout = random_like(q)
    scale = 32 ** -0.5
    results = []
    full = max(n_q, n_k)
    for seq_lens in (None, torch.tensor([full, full], dtype=torch.int32, device=device)):
        out, lse = ka.attention_fwd(q, k, v, causal, scale, seq_lens)
        results.append((out, lse, *ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, seq_lens)))
    for name, even, masked in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(even, masked), name


@pytest.mark.parametrize("layout", ["bhnd", "sliced"])
@pytest.mark.parametrize("causal", [False, True])
def test_row_offset_addressing_gives_the_same_bits(device, causal, layout):
    """AttnConfig.rowoff (streamed blocks addressed as the first tile plus a row offset) loads the
    same tiles and does the same math as advancing pointer tiles, in the forward and in both backward
    kernels: out, lse, dq, dk and dv are bitwise equal, with tail blocks, n_q != n_k both ways, a padded
    head_dim (80), seq_lens and strided inputs. rowoff is a pointer-path flag: with TMA it is refused."""
    from dataclasses import replace

    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import INTERPRETER_CONFIG, AttnConfig, BwdConfig

    tiles = INTERPRETER_CONFIG if ka.INTERPRETED else AttnConfig(64, 64, 4, 3)
    off = replace(tiles, rowoff=True)
    scale = 80 ** -0.5
    for n_q, n_k in ((113, 70), (70, 113)):
        q, k, v = make_qkv(2, 2, n_q, n_k, 80, torch.float16, device, layout=layout)
        dout = random_like(q)
        for seq_lens in (None, torch.tensor([min(n_q, n_k), 31], dtype=torch.int32, device=device)):
            pointer = ka.attention_fwd(q, k, v, causal, scale, seq_lens, config=tiles)
            offset = ka.attention_fwd(q, k, v, causal, scale, seq_lens, config=off)
            for name, a, b in zip(("out", "lse"), pointer, offset):
                assert torch.equal(a, b), (name, n_q, n_k, seq_lens)
            out, lse = pointer
            grads = [ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, seq_lens, config=cfg)
                     for cfg in (BwdConfig(tiles, tiles), BwdConfig(off, off), BwdConfig(replace(off, split=True), off))]
            for name, *each in zip(("dq", "dk", "dv"), *grads):
                for other in each[1:]:
                    assert torch.equal(each[0], other), (name, n_q, n_k, seq_lens)
    with pytest.raises(ValueError, match="rowoff"):
        AttnConfig(64, 64, 4, 3, tma=True, rowoff=True)


def test_tile_flags_that_cannot_work_are_refused():
    """AttnConfig refuses flag combinations that have no meaning or that Triton miscompiles, naming the
    flag: row64 without rowoff, ws without TMA, ws with other than WS_WARPS warps (with 4, Triton 3.6
    compiled the D128 forward into a kernel whose output was off by 0.47 on the H200)."""
    from diyflash.kernels.attention_configs import WS_WARPS, AttnConfig

    with pytest.raises(ValueError, match="row64"):
        AttnConfig(64, 64, 4, 3, row64=True)
    with pytest.raises(ValueError, match="needs tma"):
        AttnConfig(128, 64, WS_WARPS, 2, ws=True)
    with pytest.raises(ValueError, match="num_warps=8 only"):
        AttnConfig(128, 64, 4, 2, tma=True, ws=True)
    assert AttnConfig.from_tiles((64, 64, 4, 3, "rowoff", "row64")).as_tiles() == (64, 64, 4, 3, "rowoff", "row64")


def test_row64_tiles_keep_64_bit_row_offsets():
    """row64 tiles launch with ROW32 off even where the launcher's check allows 32 bits; other tiles
    follow the check."""
    from diyflash.kernels.attention.launch_args import tile_meta
    from diyflash.kernels.attention_configs import AttnConfig

    rowoff = AttnConfig(64, 64, 4, 3, rowoff=True)
    row64 = AttnConfig(64, 64, 4, 3, rowoff=True, row64=True)
    assert tile_meta(rowoff, False, None, 128, 128, True)["ROW32"] is True
    assert tile_meta(row64, False, None, 128, 128, True)["ROW32"] is False
    assert tile_meta(rowoff, False, None, 128, 128, False)["ROW32"] is False


def test_rows_fit_int32_bounds():
    """The launcher's check behind the kernels' 32-bit row offsets (ROW32): every offset a tile can form
    inside a (batch, head) slice, rows up to N + MAX_BLOCK_ROWS and columns up to the padded head_dim,
    must fit in int32; the batch and head strides do not count (those offsets are 64-bit anyway)."""
    from diyflash.kernels.attention import MAX_BLOCK_ROWS, rows_fit_int32

    def t(n, d, row_stride, d_stride=1, batch_stride=2**40):
        return torch.empty_strided((3, 2, n, d), (batch_stride, row_stride * n, row_stride, d_stride), device="meta")

    stride = 4096
    n = 2**31 // stride - MAX_BLOCK_ROWS  # (n + 256) * 4096 == 2^31: one past the last int32 offset
    assert rows_fit_int32(t(n - 1, 64, stride))
    assert not rows_fit_int32(t(n, 64, stride))
    assert not rows_fit_int32(t(16, 64, stride), t(n, 64, stride))  # every tensor counts
    assert rows_fit_int32(t(16, 80, 80)) and rows_fit_int32(t(16, 64, 0))  # a stride-0 (expanded) row
    assert not rows_fit_int32(t(16, 64, 1, d_stride=2**26))  # a huge head_dim stride: 128 * 2^26 = 2^33


@pytest.mark.parametrize("causal", [False, True])
def test_int32_row_offsets_give_the_same_bits(device, causal, monkeypatch, fresh_caches):
    """ROW32 (row offsets in 32 bits where rows_fit_int32 allows) computes the same addresses as the
    64-bit offsets, in the forward and both backward kernels, for pointer tiles advanced block by block
    and for rowoff tiles: out, lse, dq, dk, dv bitwise equal with the check forced false, and equal to
    those of row64 tiles (64-bit row offsets always). Tails, n_q != n_k, head_dim 80, seq_lens, a sliced
    layout."""
    from dataclasses import replace

    from diyflash.kernels.attention import launch as ka, launch_bwd
    from diyflash.kernels.attention_configs import INTERPRETER_CONFIG, AttnConfig, BwdConfig

    tiles = INTERPRETER_CONFIG if ka.INTERPRETED else AttnConfig(64, 64, 4, 3)
    q, k, v = make_qkv(2, 2, 113, 70, 80, torch.float16, device, layout="sliced")
    dout = random_like(q)
    scale = 80 ** -0.5
    for seq_lens in (None, torch.tensor([70, 31], dtype=torch.int32, device=device)):
        for cfgs in ((tiles,), (replace(tiles, rowoff=True), replace(tiles, rowoff=True, row64=True))):
            results = []
            for cfg in cfgs:
                for fits in (True, False):
                    diyflash.clear_caches()  # a replayed plan would keep the first call's ROW32
                    for module in (ka, launch_bwd):  # the forward's launcher and the backward's
                        monkeypatch.setattr(module, "rows_fit_int32", lambda *tensors, fits=fits: fits)
                    out, lse = ka.attention_fwd(q, k, v, causal, scale, seq_lens, config=cfg)
                    grads = ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, seq_lens,
                                             config=BwdConfig(cfg, cfg))
                    results.append((out, lse, *grads))
            for name, first, *others in zip(("out", "lse", "dq", "dk", "dv"), *results):
                for other in others:
                    assert torch.equal(first, other), (name, cfgs, seq_lens)


@pytest.mark.skipif(not ON_GPU, reason="a 2^31-element row span needs a 4.5 GB buffer: GPU suite only")
@pytest.mark.parametrize("rowoff", [False, True])
def test_row_offsets_past_int32(device, rowoff):
    """k and v rows 2^21 elements apart: the last key rows lie past 2^31 elements from their slice's
    start, so the launcher keeps 64-bit row offsets (rows_fit_int32 is false) and nothing wraps. Forward
    and backward against float64, on the pointer path (tiles advanced or rowoff)."""
    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import AttnConfig, BwdConfig

    n, d, stride = 1100, 64, 2**21  # (n - 1) * stride > 2^31
    gen = torch.Generator(device=device).manual_seed(0)
    buffers = [torch.empty((n - 1) * stride + d, device=device, dtype=torch.float16) for _ in range(2)]
    k, v = (b.as_strided((1, 1, n, d), (0, 0, stride, 1)) for b in buffers)
    for t in (k, v):
        t.copy_(torch.randn(t.shape, device=device, dtype=t.dtype, generator=gen))
    q = torch.randn(1, 1, 77, d, device=device, dtype=torch.float16, generator=gen)
    assert not ka.rows_fit_int32(k)
    cfg = AttnConfig(64, 64, 4, 3, rowoff=rowoff)
    scale = d ** -0.5
    out, lse = ka.attention_fwd(q, k, v, False, scale, None, config=cfg)
    dout = torch.randn(out.shape, device=device, dtype=out.dtype, generator=gen)
    dq, dk, dv = ka.attention_bwd(dout, None, q, k, v, out, lse, False, scale, None, config=BwdConfig(cfg, cfg))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*leaves, causal=False, scale=scale)
    want = torch.autograd.grad(ref, leaves, dout.double())
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-3)
    for got, w in zip((dq, dk, dv), want):
        torch.testing.assert_close(got.double(), w, rtol=0, atol=1e-2)


@pytest.mark.parametrize("layout", ["bhnd", "bnhd", "sliced"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tma_path_matches_pointer_path(device, dtype, causal, layout):
    """Tiles read through TMA descriptors (compiled on Hopper; emulated by the interpreter) give what
    the pointer path gives, forward and backward, with partial tail blocks, n_q != n_k, a padded
    head_dim (80) and a sequence cut short by seq_lens whose padding holds NaN: the descriptors' shape
    is the valid length, so the padding is never read. The same with warp-specialized main loops
    (ws; compiled on Hopper, a plain loop under the interpreter)."""
    from dataclasses import replace

    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import WS_WARPS, BwdConfig, bwd_config, fwd_config

    q, k, v = make_qkv(2, 2, 113, 70, 80, dtype, device, layout=layout)
    dout = random_like(q)
    seq_lens = torch.tensor([70, 31], dtype=torch.int32, device=device)
    for t in (q, k, v, dout):
        t[1, :, 31:] = float("nan")  # batch 1's padding
    assert ka.tma_ok(q, k, v) and ka.tma_ok(dout)  # else this test would not reach the TMA path
    scale = 80 ** -0.5
    fwd = fwd_config(128, dtype, q.device, causal, ka.INTERPRETED)
    bwd = bwd_config(128, dtype, q.device, causal, ka.INTERPRETED)
    results = []
    for tma, ws in ((False, False), (True, False), (True, True)):
        flags = dict(tma=tma, ws=ws, **({"num_warps": WS_WARPS} if ws else {}))
        fwd_flags = dict(flags, **({"lazy": False} if ws else {}))  # lazy rescaling votes in plain loops only
        out, lse = ka.attention_fwd(q, k, v, causal, scale, seq_lens, config=replace(fwd, **fwd_flags))
        grads = ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, seq_lens,
                                 config=BwdConfig(replace(bwd.dkdv, **flags), replace(bwd.dq, **flags)))
        results.append((out, lse, *grads))
    for name, pointer, *tma in zip(("out", "lse", "dq", "dk", "dv"), *results):
        for got in tma:
            assert not got.isnan().any(), name
            torch.testing.assert_close(got, pointer, atol=2e-3, rtol=1e-2, msg=name)


@pytest.mark.parametrize("layout", ["bhnd", "bnhd", "sliced", "3d"])
@pytest.mark.parametrize("causal", [False, True])
def test_host_descriptors_match_the_pointer_path(device, causal, layout, monkeypatch, fresh_caches):
    """Without seq_lens the forward's TMA tiles read q, k and v through descriptors built on the host
    over the whole tensors (kernels.attention.host_descriptor, one per tensor and launch); out and lse
    equal the pointer path's bit for bit with tail blocks both ways, n_q != n_k, a padded head_dim (80),
    permuted, sliced and 3-D layouts, and a second call (a replayed plan on the GPU) builds them anew for
    its own tensors. With seq_lens, a broadcast (stride-0) k, or less work than HOST_DESC_MIN_WORK (a
    short call, bound by host time), the per-program descriptors serve."""
    from dataclasses import replace

    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention import plans
    from diyflash.kernels.attention_configs import fwd_config

    built = []
    make = plans.host_descriptor
    monkeypatch.setattr(plans, "host_descriptor", lambda t, *a: built.append(t.shape) or make(t, *a))
    tiles = fwd_config(128, torch.float16, device, causal, ka.INTERPRETED)
    tma_tiles = replace(tiles, tma=True, rowoff=False, row64=False)
    pointer_tiles = replace(tiles, tma=False)
    scale = 80 ** -0.5
    q, k, v = make_qkv(2, 3, 113, 70, 80, torch.float16, device, layout=layout)
    ka.attention_fwd(q, k, v, causal, scale, None, config=tma_tiles)
    assert built == []  # a short call: per-program descriptors
    monkeypatch.setattr(ka, "HOST_DESC_MIN_WORK", 0)
    diyflash.clear_caches()
    for n_q, n_k in ((113, 70), (70, 113)):
        q, k, v = make_qkv(2, 3, n_q, n_k, 80, torch.float16, device, layout=layout)
        pointer = ka.attention_fwd(q, k, v, causal, scale, None, config=pointer_tiles)
        assert built == []
        for call in range(2):
            fresh = [t.clone() for t in (q, k, v)]  # other tensors of the same layout: same plan, new descriptors
            with_desc = ka.attention_fwd(*(fresh if call else (q, k, v)), causal, scale, None, config=tma_tiles)
            assert len(built) == 3 * (call + 1), built
            for name, a, b in zip(("out", "lse"), pointer, with_desc):
                assert torch.equal(a, b), (name, n_q, n_k, call)
        built.clear()
    lens = torch.tensor([50, 31], dtype=torch.int32, device=device)
    ka.attention_fwd(q, k, v, causal, scale, lens, config=tma_tiles)
    if layout != "3d":
        wide = k[:, :1].expand(k.shape)  # one head's keys for every head: stride 0 along heads
        assert not ka.host_descriptors_ok(wide) and ka.tma_ok(wide)
        got = ka.attention_fwd(q, wide, wide, causal, scale, None, config=tma_tiles)
        want = ka.attention_fwd(q, wide, wide, causal, scale, None, config=pointer_tiles)
        assert torch.equal(got[0], want[0])
    assert built == []


def _climbing_scores(b, h, n_q, n_k, d, dtype, device, seed=0):
    """q, k, v whose scores climb along the keys for some rows and fall for others (k_j = noise + t_j u,
    so row i moves by t_j (q_i . u)): each key block moves some rows' max by more than LAZY_SLACK and
    others' by less or not at all, warp by warp; plus one late key per head that makes a different set
    of rows jump. Lazy rescaling then both rescales and skips, in every warp."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=gen)
    u = torch.randn(d, generator=gen)
    u = u / u.norm()
    ramp = torch.linspace(0, 6 * d ** 0.5, n_k)[:, None] * u  # up to ~6 score units (x qk_scale) per |q . u|
    k = torch.randn(b, h, n_k, d, generator=gen) + ramp
    late = torch.randint(n_k // 2, n_k, (b, h), generator=gen)
    for z in range(b):
        for hh in range(h):
            row = torch.randint(0, n_q, (1,), generator=gen).item()
            k[z, hh, late[z, hh]] += 3 * q[z, hh, row]  # row `row` (and rows like it) jump at that key
    v = torch.randn(b, h, n_k, d, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


@pytest.mark.parametrize("n_q,n_k", [(113, 300), (300, 113)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lazy_rescaling_meets_the_error_rule(device, dtype, causal, n_q, n_k):
    """AttnConfig.lazy (a row's running max moves only when a key block passes it by more than
    LAZY_SLACK, so p = exp2(s - m) reaches up to 2^8 before the final division) meets the error rule on
    scores that climb and jump, with tail blocks both ways; its lse equals the plain tiles' to fp32
    rounding."""
    from dataclasses import replace

    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import INTERPRETER_CONFIG, AttnConfig

    tiles = INTERPRETER_CONFIG if ka.INTERPRETED else AttnConfig(128, 64, 8, 3, rowoff=True)
    lazy = replace(tiles, lazy=True)
    q, k, v = _climbing_scores(2, 2, n_q, n_k, 64, dtype, device)
    _, _, reports = attention_error_reports(
        lambda q, k, v, causal, scale, seq_lens: ka.attention_fwd(q, k, v, causal, scale, seq_lens, config=lazy)[0],
        q, k, v, causal, 64 ** -0.5, None, grad=False)
    for report in reports:
        assert report.ok, str(report)
    _, lse_plain = ka.attention_fwd(q, k, v, causal, 64 ** -0.5, None, config=tiles)
    _, lse_lazy = ka.attention_fwd(q, k, v, causal, 64 ** -0.5, None, config=lazy)
    torch.testing.assert_close(lse_lazy, lse_plain, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(not ON_GPU, reason="the branch that skips a warp's rescale is inline PTX: compiled kernels only")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles,head_dim", [
    ((128, 64, 8, 3, "rowoff", "lazy"), 64),  # 2 rows a thread
    ((128, 64, 8, 3, "lazy"), 64),
    ((64, 64, 4, 3, "tma", "lazy"), 128),  # 2 rows a thread, 4 warps
    ((128, 64, 4, 2, "tma", "lazy"), 128),  # 4 rows a thread
    ((128, 64, 8, 2, "tma", "lazy"), 256),
])
def test_lazy_rescaling_skips_only_warps_that_kept_every_max(device, causal, tiles, head_dim, monkeypatch, fresh_caches):
    """The compiled lazy forward votes across each warp (vote.sync.any) and branches around the
    accumulator's rescale where no row of the warp moved its max; the rows that did not move have alpha
    exactly 1, so skipping gives the same bits as multiplying. Out and lse equal the same tiles with the
    branch off (vote_rows -> 0: every warp multiplies) bit for bit, on climbing and jumping scores where
    every warp rescales at some blocks and skips at others, with tails and n_q != n_k. A vote that
    missed a row of its warp (a wrong rows-per-thread count) would leave that row's accumulator
    unscaled, off by 2^8 or more."""
    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import AttnConfig, head_dim_pad

    cfg = AttnConfig.from_tiles(tiles)
    assert ka.vote_rows(cfg, head_dim_pad(head_dim)) > 0  # else this test would not reach the branch
    scale = head_dim ** -0.5
    for n_q, n_k in ((1000, 1500), (1500, 1000)):
        q, k, v = _climbing_scores(2, 3, n_q, n_k, head_dim, torch.float16, device)
        results = []
        for branch in (True, False):
            diyflash.clear_caches()
            if not branch:
                monkeypatch.setattr(ka, "vote_rows", lambda cfg, d_pad: 0)
            results.append(ka.attention_fwd(q, k, v, causal, scale, None, config=cfg))
        for name, a, b in zip(("out", "lse"), *results):
            assert torch.equal(a, b), (name, n_q, n_k)


def test_vote_rows_rule():
    """vote_rows: the accumulator rows each thread holds where warps stack along the rows (block_m a
    multiple of 16 * num_warps) and the rescale's 32-element asm blocks divide a thread's elements;
    else 0 (lazy tiles multiply as usual). Lazy is refused with ws and in the backward."""
    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import AttnConfig, BwdConfig

    lazy = lambda *t: AttnConfig(*t, lazy=True)  # noqa: E731
    assert ka.vote_rows(lazy(128, 64, 8, 3), 64) == 2
    assert ka.vote_rows(lazy(64, 64, 4, 3), 128) == 2
    assert ka.vote_rows(lazy(128, 64, 4, 2), 128) == 4
    assert ka.vote_rows(lazy(64, 64, 8, 3), 64) == 0  # 8 warps on 64 rows: warps side by side along head_dim
    assert ka.vote_rows(lazy(128, 64, 4, 3), 16) == 0  # 16 accumulator elements a thread
    with pytest.raises(ValueError, match="lazy"):
        AttnConfig(128, 64, 8, 2, tma=True, ws=True, lazy=True)
    q = torch.zeros(1, 1, 8, 16)
    with pytest.raises(ValueError, match="forward flag"):
        ka.attention_bwd(q, None, q, q, q, q, q[..., 0], False, 1.0, None,
                         config=BwdConfig(lazy(32, 32, 4, 1), AttnConfig(32, 32, 4, 1)))


def test_host_descriptor_strides_are_aligned_where_sizes_are_one():
    """TMA wants every stride 16-byte aligned; a size-1 dimension's stride never moves the address, so
    host_descriptor gives it a dense one (a single sliced head, a single row, a 3-D input's head axis)."""
    from diyflash.kernels.attention import host_descriptor

    base = torch.empty(10_000, dtype=torch.float16, device="meta")
    t = base.as_strided((1, 1, 1, 64), (4099, 1001, 77, 1))  # every stride odd, every size but D one
    desc = host_descriptor(t, 64, 64)
    assert desc.shape == [1, 1, 1, 64] and desc.strides == [64, 64, 64, 1]
    three = base.as_strided((4, 9, 40), (9 * 40, 40, 1))
    desc = host_descriptor(three, 32, 64)
    assert desc.shape == [4, 1, 9, 40] and desc.strides == [360, 360, 40, 1] and desc.block_shape == [1, 1, 32, 64]


def test_tma_ok_only_for_what_descriptors_can_read(device):
    """TMA needs fp16/bf16, a contiguous head_dim and 16-byte aligned strides and base; other inputs
    run the pointer path (and still give the right answer: test_layouts)."""
    from diyflash.kernels.attention import launch as ka

    q, _, _ = make_qkv(2, 3, 40, 40, 64, torch.float16, device)
    assert ka.tma_ok(q) == (device.type == "cpu" or torch.cuda.get_device_capability(device)[0] >= 9)
    if not ka.tma_ok(q):
        return
    assert ka.tma_ok(q.transpose(1, 2))  # (b, n, h, d) storage: strides are multiples of 16 bytes
    assert not ka.tma_ok(q.float())  # fp32: pointer path
    assert not ka.tma_ok(q.transpose(-1, -2))  # head_dim not contiguous
    off_by_one = torch.zeros(q.numel() + 1, dtype=q.dtype, device=device)[1:].view(q.shape)
    assert not ka.tma_ok(off_by_one)  # base 2 bytes past an aligned address
    odd_rows = torch.zeros(2, 3, 40, 68, dtype=torch.float16, device=device)[..., :64]  # rows 136 bytes apart
    assert not ka.tma_ok(odd_rows)
    assert ka.tma_ok(odd_rows[:, :, :1])  # one row: its stride never moves the address


def test_scratch_allocator_is_installed_once_and_keeps_the_users():
    """Device-built descriptors need Triton's global-scratch allocator. A thread without one (autograd's
    backward thread starts without: it is a context variable) gets diyflash's; a user's stays."""
    import contextvars

    import triton

    from diyflash.kernels import _launch
    from triton.runtime import _allocation

    def fresh():
        _allocation._allocator.set(_allocation._NULL_ALLOCATOR)
        _launch.ensure_scratch_allocator()
        return _allocation._allocator.get()

    assert contextvars.Context().run(fresh) is _launch._scratch

    def users():
        mine = lambda size, alignment, stream: None  # noqa: E731
        triton.set_allocator(mine)
        _launch.ensure_scratch_allocator()
        return _allocation._allocator.get() is mine

    assert contextvars.Context().run(users)


@pytest.mark.skipif(not ON_GPU, reason="Triton asks for global scratch on the GPU only")
@pytest.mark.parametrize("allocator", ["none", "foreign"])
def test_scratch_is_shared_by_a_streams_launches(fresh_caches, allocator):
    """One scratch buffer per (device, stream), grown to the largest launch's need, serves every launch
    with device-built descriptors (no allocation per launch); a CUDA graph's launches get their own. So also
    where the thread has another library's Triton allocator ("foreign": torch.compile's kernels install
    inductor's in the thread that runs them), through the C launcher, which does not ask it."""
    import contextvars
    from dataclasses import replace

    import triton
    from diyflash.kernels import _claunch, _launch
    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import fwd_config
    from triton.runtime import _allocation

    if allocator == "foreign" and _claunch.module() is None:
        pytest.skip(f"no C launcher here ({_claunch.reason()}): Triton's launcher asks the thread's allocator")
    asked = []

    def foreign(size, alignment, stream):
        asked.append(size)
        return torch.empty(size, dtype=torch.int8, device="cuda")

    def check():
        if allocator == "foreign":
            triton.set_allocator(foreign)
        else:
            _allocation._allocator.set(_allocation._NULL_ALLOCATOR)
        small, large = (make_qkv(b, 4, 128, 128, 64, torch.float16, "cuda")[0] for b in (1, 8))
        cfg = replace(fwd_config(64, torch.float16, small.device, False, False, 128), tma=True, rowoff=False,
                      row64=False)
        fwd = lambda x: ka.attention_fwd(x, x, x, False, 0.125, None, config=cfg)[0]  # noqa: E731
        want = [fwd(x) for x in (small, large)]  # the first calls compile (Triton's launcher may run them)
        asked.clear()
        assert all(torch.equal(fwd(x), w) for x, w in zip((small, large), want))
        assert asked == []  # the replayed launches did not ask the thread's allocator
        kept = diyflash.cache_info()["launch scratch bytes"]
        assert kept > 0 and diyflash.cache_info()["launch scratch"] == 1
        assert _launch._scratch(kept, 128, torch.cuda.current_stream().cuda_stream).numel() == kept
        assert torch.equal(fwd(small), want[0])
        assert diyflash.cache_info()["launch scratch bytes"] == kept  # the large launch's buffer serves the small
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fwd(large)
        assert diyflash.cache_info()["launch scratch"] == 1  # nothing kept for the capture's stream
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want[1])
        assert _allocation._allocator.get() is (foreign if allocator == "foreign" else _launch._scratch)

    contextvars.Context().run(check)


@pytest.mark.skipif(not ON_GPU, reason="64-bit offsets need > 2^31-element tensors: GPU suite only")
def test_64bit_offsets(device):
    """q, k, v of 2^31 + 2^17 elements each: batch offsets past 2^31 must not wrap (fwd and bwd),
    checked on the last batch rows against the oracle."""
    b, h, n, d = 16385, 1, 1024, 128
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=torch.float16, generator=gen) for _ in range(3))
    assert q.numel() > 2**31
    for t in (q, k, v):
        t.requires_grad_()
    out = torch.ops.diyflash.attention(q, k, v, causal=True)
    g = torch.randn(out.shape, device=device, dtype=out.dtype, generator=gen)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    tail = slice(b - 2, b)
    leaves = [t[tail].detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*leaves, causal=True)
    want = torch.autograd.grad(ref, leaves, g[tail].double())
    torch.testing.assert_close(out[tail].double(), ref, rtol=0, atol=5e-3)
    for got, w in zip((dq, dk, dv), want):
        torch.testing.assert_close(got[tail].double(), w, rtol=0, atol=2e-2)


def test_grid_z_chunking_path(device, monkeypatch):
    """The sliced launches behind the 65535 grid limit, exercised with a limit of 2 (batch 5, 3-D)."""
    from diyflash.kernels.attention import plans

    monkeypatch.setattr(plans, "MAX_GRID_Z", 2)
    q, k, v = make_qkv(5, 1, 19, 23, 16, torch.float16, device, layout="3d", requires_grad=True)
    check_attention(q, k, v, causal=True, seq_lens=torch.tensor([19, 3, 23, 1, 9], dtype=torch.int32, device=device))


@pytest.mark.skipif(not ON_GPU, reason="70000 programs along the grid's z axis: GPU suite only")
def test_grid_z_chunks(device):
    """More than 65535 (batch * heads) rows: launched in grid-sized slices, every slice correct."""
    q, k, v = make_qkv(70000, 1, 16, 24, 16, torch.float16, device, layout="3d", requires_grad=True)
    out = torch.ops.diyflash.attention(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    rows = torch.tensor([0, 65534, 65535, 65536, 69999], device=device)
    leaves = [t[rows].detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*leaves, causal=True)
    want = torch.autograd.grad(ref, leaves, torch.ones_like(ref))
    torch.testing.assert_close(out[rows].double(), ref, rtol=0, atol=2e-3)
    for got, w in zip((dq, dk, dv), want):
        torch.testing.assert_close(got[rows].double(), w, rtol=0, atol=1e-2)
