"""The order programs take their tiles in: head groups of causal grids (every order the same bits), a persistent
kernel's turns and the Hopper forward's split last round (every tile, every key block, taken once; each program's
work bounded), and the rules that choose them (grids.head_group, hopper.schedule, hopper.split).

The same file runs on CPU (Triton interpreter) and on CUDA.
"""

import pytest
import torch

from diyflash.reference import attention_ref
from helpers import make_qkv, random_like


try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch path's CPU run
    triton = None

if triton is not None:
    from diyflash.kernels.attention.tile_order import _tile_at, _turn, _turns, _work, _work_turns

    @triton.jit
    def _record_turns(out_ptr, num_tiles, num_heads, num_bh, head_group, MAX_TURNS: tl.constexpr, DEAL: tl.constexpr):
        p = tl.program_id(0)
        for i in range(_turns(num_tiles, num_bh, head_group, DEAL=DEAL)):
            lin, live = _turn(i, num_tiles, num_bh, head_group, DEAL=DEAL)
            tile, head, batch = _tile_at(lin, num_tiles, num_heads, num_bh, head_group, DEAL=DEAL, REVERSE=DEAL)
            at = out_ptr + (p * MAX_TURNS + i) * 2
            tl.store(at, tl.where(live, (batch * num_heads + head) * num_tiles + tile, -1))
            tl.store(at + 1, tl.where(live, tile + 1, 0))  # the key blocks it sees (causal)

    @triton.jit
    def _record_work(out_ptr, num_tiles, num_bh, blocks, split_blocks, max_pieces, MAX_TURNS: tl.constexpr):
        p = tl.program_id(0)
        for i in range(_work_turns(num_tiles, num_bh, 1, split_blocks, DEAL=False, SPLIT=True)):
            lin, live, first, end, piece = _work(i, num_tiles, num_bh, 1, blocks, split_blocks, max_pieces,
                                                 DEAL=False, SPLIT=True)
            at = out_ptr + (p * MAX_TURNS + i) * 4
            tl.store(at, tl.where(live, lin, -1))
            tl.store(at + 1, first)
            tl.store(at + 2, end)
            tl.store(at + 3, piece)


@pytest.mark.parametrize("causal", [False, True])
def test_head_groups_deal_out_every_tile_once(device, causal):
    """The order programs take their tiles in (kernels.attention.tile_order._tile, dealt over groups of heads)
    changes nothing in the results: groups of 1, 3 (the last one short), 7 and every head give the same
    out, lse, dq, dk and dv bit for bit, and those match float64. 10 heads, tail blocks, n_q != n_k."""
    from diyflash.kernels.attention import launch as ka

    q, k, v = make_qkv(2, 5, 77, 50, 32, torch.float16, device)
    dout = random_like(q)
    scale = 32 ** -0.5
    results = []
    for group in (1, 3, 7, 10):
        out, lse = ka.attention_fwd(q, k, v, causal, scale, None, group=group)
        results.append((out, lse, *ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, group=group)))
    for name, first, *others in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert all(torch.equal(first, other) for other in others), name
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*leaves, causal=causal)
    torch.testing.assert_close(results[0][0].double(), ref, rtol=0, atol=2e-3)
    for got, want in zip(results[0][2:], torch.autograd.grad(ref, leaves, dout.double())):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-2)


def test_persistent_turns_take_every_tile_once(device):
    """A persistent kernel's turns (tile_order._turns, _turn; the Hopper forward's): every tile of the grid
    taken by exactly one program, and, for causal tiles dealt over head groups (hopper.schedule's group),
    every program's work (the key blocks its tiles see: heavy tiles first in a group, _tile_at) at most a
    tile above the mean, and within 2 % of it for long grids (plain turns, p, p + P, ..., left the busiest
    program 29 % above the mean at MHA causal B2 H16 N8192 on 132 programs)."""
    if triton is None:
        pytest.skip("triton is not installed")
    from diyflash.kernels.attention import hopper
    from diyflash.kernels._runtime import DeviceLimits

    cuda = torch.device("cuda", 0)
    for num_tiles, heads, batch, sms, causal in [(64, 16, 2, 132, True), (64, 16, 2, 132, False), (4, 3, 5, 7, True),
                                                  (5, 7, 1, 4, True), (3, 2, 1, 50, True), (9, 2, 3, 6, False)]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(hopper, "device_limits", {cuda: DeviceLimits(228 * 1024, True, sms)}.get)
            programs, group = hopper.schedule(num_tiles, batch * heads, causal, cuda)
        assert programs == min(sms, num_tiles * batch * heads)
        max_turns = 2 * num_tiles * batch * heads
        out = torch.full((programs, max_turns, 2), -2, dtype=torch.int32, device=device)
        _record_turns[(programs,)](out, num_tiles, heads, batch * heads, group, MAX_TURNS=max_turns, DEAL=causal)
        taken = out[..., 0][out[..., 0] >= 0].cpu()
        assert sorted(taken.tolist()) == list(range(num_tiles * batch * heads)), (num_tiles, heads, batch, sms)
        if causal and num_tiles * batch * heads >= 2 * programs:
            work = out[..., 1].clamp(min=0).sum(1).double()
            assert work.max() - work.mean() <= num_tiles, work  # at most a tile's keys above the mean
            assert work.max() <= 1.02 * work.mean() or num_tiles * heads * batch < 10 * programs, work


def test_split_last_round_takes_every_key_block_once(device, monkeypatch):
    """The Hopper forward's last round cut into runs of key blocks (hopper.split, tile_order._work): every key
    block of every tile computed by exactly one program, the whole rounds' tiles whole; each piece numbered
    r * max_pieces + its rank, as the merge (merge.py) reads them: a tile's pieces the ranks 0.. of the runs
    that fall in it; every program's blocks at most the whole rounds' and a run; no split where the tiles
    fill the rounds, for banded calls, or where the run saves less than SPLIT_MIN_GAIN."""
    if triton is None:
        pytest.skip("triton is not installed")
    from diyflash.kernels.attention import hopper

    assert hopper.split(64, 32, 64, 132, banded=False)[:2] == (33, 3)  # MHA D128 full B2 H16 N8192
    assert hopper.split(43, 32, 64, 132, banded=False)[:2] == (28, 4)  # D64's 192-row tiles
    assert hopper.split(64, 32, 64, 132, banded=True) is None
    assert hopper.split(66, 2, 64, 132, banded=False) is None  # the rounds are full
    assert hopper.split(131, 1, 64, 132, banded=False) is None  # less than a round: schedule's programs
    assert hopper.split(133, 1, 64, 132, banded=False)[:2] == (10, 7)  # one tile over: at most 8 pieces
    assert hopper.split(265, 1, 2, 132, banded=False) is None  # a piece costs more than it saves
    monkeypatch.setattr(hopper, "SPLIT_MIN_GAIN", -100.0)  # the small grids below split whatever they save
    for num_tiles, num_bh, blocks, programs in [(64, 32, 64, 132), (43, 32, 64, 132), (5, 3, 7, 4), (7, 1, 3, 5),
                                                (9, 2, 2, 4), (4, 5, 9, 6)]:
        cut = hopper.split(num_tiles, num_bh, blocks, programs, banded=False)
        max_turns = num_tiles * num_bh // programs + 2
        out = torch.full((programs, max_turns, 4), -9, dtype=torch.int32, device=device)
        _record_work[(programs,)](out, num_tiles, num_bh, blocks, cut.split_blocks, cut.max_pieces,
                                  MAX_TURNS=max_turns)
        out = out.cpu()
        seen = torch.zeros(num_tiles * num_bh, blocks, dtype=torch.int32)
        pieces: dict = {}
        for p in range(programs):
            work = 0
            for lin, first, end, piece in out[p].tolist():
                if lin < 0:
                    continue
                seen[lin, first:end] += 1
                work += end - first
                if lin < cut.first_lin:
                    assert (first, end, piece) == (0, blocks, -1)
                else:
                    pieces.setdefault(lin - cut.first_lin, []).append(piece)
            assert work <= (cut.first_lin // programs) * blocks + cut.split_blocks
        assert (seen == 1).all(), (num_tiles, num_bh, blocks, programs)
        assert sorted(pieces) == list(range(cut.rest))
        for r, got in pieces.items():
            count = ((r + 1) * blocks - 1) // cut.split_blocks - (r * blocks) // cut.split_blocks + 1
            assert sorted(got) == [r * cut.max_pieces + i for i in range(count)] and count <= cut.max_pieces


def test_head_group_rule():
    """Causal kernels deal tiles over the most heads that divide the batch's heads and hold at most
    about one wave of tiles (GROUP_TILES_PER_SM per SM); other kernels, and no GPU, go head after head."""
    from diyflash.kernels.attention import grids as ka
    from diyflash.kernels._runtime import DeviceLimits

    cuda = torch.device("cuda", 0)
    limits = {cuda: DeviceLimits(228 * 1024, True, 132)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ka, "device_limits", limits.get)
        mp.setattr(ka, "GROUP_TILES_PER_SM", 2)
        assert ka.head_group(True, 16, 128, cuda) == 16  # 264 // 16 = 16 heads of 16 tiles
        assert ka.head_group(True, 32, 128, cuda) == 8
        assert ka.head_group(True, 32, 12, cuda) == 6  # 8 fit, 6 divide 12
        assert ka.head_group(True, 32, 7, cuda) == 7  # every head fits: one group
        assert ka.head_group(True, 32, 11, cuda) == 1  # a prime count past the cap: head after head
        assert ka.head_group(True, 1024, 128, cuda) == 1  # one head is more than a wave
        assert ka.head_group(False, 16, 128, cuda) == 1
        limits[cuda] = DeviceLimits(None, True, None)
        assert ka.head_group(True, 16, 128, cuda) == 1
