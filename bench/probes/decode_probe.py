"""Probe (issue 25): the decode kernel's tiles (keys per step, pipeline stages, warps) and split counts, GPU
time of a CUDA graph replay as a share of the copy bandwidth (bench.decode's measure), at the cells the
targets name and a few between. Phase 1 times every tile at the chosen split count (a table: tiles x
cells), phase 2 the best three tiles of each cell at each split count. The floor: one empty kernel's
graph replay, timed the same way. Every timing goes to --out (JSON lines). --grid: instead, a few tiles at
every split count, a table per cell (where the chosen split count leaves a partial wave of programs).
--paged: a paged cache (pages of 256 rows, shuffled), a few tiles at 1-4 programs an SM. Since 2026-11-25
every time is clean_graph_ms (the L2 emptied by reads; the result files before it used do_bench's
zeroing flush, whose write-back added ~10 us to a 268 MB read).
    python -m bench.probes.decode_probe [--grid | --paged] [--out probe.jsonl]"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl

import diyflash
from bench.common import clean_graph_ms
from bench.decode import copy_bandwidth
from diyflash.kernels.attention import kvcache as kv

H, H_KV, D = 32, 8, 128
CELLS = [(1, 1024), (1, 8192), (1, 65536), (1, 131072), (8, 8192), (8, 65536), (16, 4096), (32, 2048), (64, 1024),
         (64, 8192), (64, 32768)]
TILES = list(itertools.product((32, 64, 128), (2, 3, 4), (4, 8)))  # (BLOCK_N, stages, warps)
SPLITS = (1, 2, 4, 8, 16, 32, 64)
GRID_CELLS = [(1, 1024), (1, 8192), (1, 65536), (2, 32768), (4, 16384), (8, 8192), (16, 4096), (32, 2048), (64, 1024)]
GRID_TILES = [(64, 3, 4), (64, 4, 4), (64, 2, 4), (128, 3, 4), (128, 2, 4)]
GRID_SPLITS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
PAGED_CELLS = [(1, 8192), (1, 65536), (1, 131072), (8, 8192), (64, 1024)]
PAGED_TILES = [(64, 3, 4), (64, 4, 4), (64, 2, 4), (32, 3, 4), (32, 4, 4), (128, 2, 4), (128, 3, 4)]


@triton.jit
def _empty(x_ptr):
    tl.store(x_ptr, 1)


CHOICE = (kv.DECODE_BLOCK_N, kv.decode_stages, kv.DECODE_WARPS)  # the launcher's own, restored after


def time_us(q, k, v, lens, tile, splits, table=None):
    kv.DECODE_BLOCK_N, stages, kv.DECODE_WARPS = tile
    kv.decode_stages = lambda programs, splits, device: stages
    kv._KV_PLANS.clear()  # plans are keyed on layouts, not on these knobs
    call = lambda: diyflash.flash_attention_with_kvcache(q, k, v, lens, num_splits=splits, block_table=table,  # noqa: E731
                                                         validate=False)
    return clean_graph_ms([call]) * 1e3


def paged_grid(out):
    """--paged: the same keys in shuffled pages of 256 rows, tiles x split counts of 1-4 programs an SM."""
    copy = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"# {torch.cuda.get_device_name()} | copy {copy / 1e12:.2f} TB/s | paged (256) | us (share of copy bandwidth)")
    for b, n in PAGED_CELLS:
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16)
        pages = b * n // 256
        k = torch.randn(pages, H_KV, 256, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(pages, H_KV, 256, D, device="cuda", dtype=torch.bfloat16)
        table = torch.randperm(pages, device="cuda").to(torch.int32).view(b, n // 256)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        per_sm = sorted({min(kv.MAX_SPLITS, n // 128, max(1, m * sms // (b * H_KV))) for m in (1, 2, 3, 4)})
        chosen = kv.num_splits_for(b, H_KV, 1, n, q.device, paged=True)
        print(f"B{b} L{n} (chosen S{chosen}): splits " + " ".join(f"{s:>9}" for s in per_sm))
        for tile in PAGED_TILES:
            _split_line(rows, b, n, q, k, v, lens, tile, per_sm, copy, table)
    _finish(rows, out)


def _split_line(rows, b, n, q, k, v, lens, tile, splits, copy, table=None):
    """Time `tile` at each split count on the (b, n) cell, append the rows, print one line: us (share of
    the copy bandwidth)."""
    cells = []
    for s in splits:
        us = time_us(q, k, v, lens, tile, s, table)
        share = 2 * b * n * H_KV * D * 2 / (us * 1e-6) / copy
        rows.append(dict(b=b, n=n, tile=tile, splits=s, us=us, share=share, paged=256 if table is not None else 0))
        cells.append(f"{us:5.1f}({100 * share:2.0f})")
    print(f"{str(tile):>14} " + " ".join(f"{c:>9}" for c in cells), flush=True)


def _finish(rows, out):
    """Restore the launcher's own tile choice; write the rows (JSON lines) to `out` if given."""
    kv.DECODE_BLOCK_N, kv.decode_stages, kv.DECODE_WARPS = CHOICE
    if out:
        with open(out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--grid", action="store_true")
    parser.add_argument("--paged", action="store_true")
    args = parser.parse_args()
    if args.paged:
        return paged_grid(args.out)
    if args.grid:
        return grid(args.out)
    copy = copy_bandwidth()
    x = torch.zeros(1, device="cuda")
    print(f"# {torch.cuda.get_device_name()} | copy {copy / 1e12:.2f} TB/s | empty kernel's graph replay "
          f"{clean_graph_ms([lambda: _empty[(1,)](x)]) * 1e3:.1f} us")
    before = (64, 3, 4)  # the tile before this probe (its stages now follow kvcache.decode_stages)
    rows, table = [], {tile: [] for tile in TILES}
    for b, n in CELLS:
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        v = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        share = lambda us: 2 * b * n * H_KV * D * 2 / (us * 1e-6) / copy  # noqa: E731
        chosen = kv.num_splits_for(b, H_KV, 1, n, q.device)
        phase1 = []
        for tile in TILES:
            us = time_us(q, k, v, lens, tile, chosen)
            phase1.append((us, tile))
            table[tile].append(us)
            rows.append(dict(b=b, n=n, tile=tile, splits=chosen, us=us, share=share(us)))
        phase1.sort()
        base = [us for us, tile in phase1 if tile == before][0]
        phase2 = []
        for _, tile in phase1[:3]:
            for s in SPLITS:
                if s != chosen and s <= max(1, n // 128):
                    us = time_us(q, k, v, lens, tile, s)
                    phase2.append((us, tile, s))
                    rows.append(dict(b=b, n=n, tile=tile, splits=s, us=us, share=share(us)))
        phase2 = sorted(phase2 + [(us, t, chosen) for us, t in phase1[:3]])
        print(f"B{b} L{n}: before {before} S{chosen}: {base:.1f} us {100 * share(base):.0f}% | best with splits: "
              + ", ".join(f"{t} S{s} {us:.1f} us {100 * share(us):.0f}%" for us, t, s in phase2[:3]), flush=True)
    kv.DECODE_BLOCK_N, kv.decode_stages, kv.DECODE_WARPS = CHOICE
    print("us at the chosen splits: tile (BLOCK_N, stages, warps) x cell")
    print(f"{'tile':>14} " + " ".join(f"{f'B{b}L{n // 1024}k':>9}" for b, n in CELLS))
    for tile, us in table.items():
        print(f"{str(tile):>14} " + " ".join(f"{u:9.1f}" for u in us))
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


def grid(out):
    copy = copy_bandwidth()
    rows = []
    print(f"# {torch.cuda.get_device_name()} | copy {copy / 1e12:.2f} TB/s | us (share of copy bandwidth)")
    for b, n in GRID_CELLS:
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        v = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        splits = [s for s in GRID_SPLITS if s <= max(1, n // 128) and b * H_KV * s <= 1024]
        chosen = kv.num_splits_for(b, H_KV, 1, n, q.device)
        print(f"B{b} L{n} (chosen S{chosen}): splits " + " ".join(f"{s:>9}" for s in splits))
        for tile in GRID_TILES:
            _split_line(rows, b, n, q, k, v, lens, tile, splits, copy)
    _finish(rows, out)


if __name__ == "__main__":
    main()
