"""Sliding-window forward and backward against the dense causal call, and which tiles suit the window.

    python -m bench.probes.window_probe [--n 16384] [--window 4095] [--top 6]

Issue 24's window cell (B1 H16 D128 fp16, causal, window 4096) measured 404 TFLOPS of visible work
against 530 for the dense causal call of the same shape (H100, 2026-11-24), where the band's masked
edge blocks are ~7 % of its blocks. This times, in turns: the window call with the tuned (causal) tiles,
the window call with every forward candidate that fits, and the dense causal call; then prints the
fastest few. TFLOPS count visible pairs only (bench.attention_variants.visible_pairs).
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.attention_variants import visible_pairs
from bench.common import interleaved_tflops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--window", type=int, default=4095)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--max", type=int, default=30, help="candidates tried (128-row tiles first)")
    args = parser.parse_args(argv)
    import diyflash.kernels.attention as ka
    from diyflash.kernels.attention_configs import FWD_CANDIDATES, fwd_config

    b, h, n, d = 1, 16, args.n, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    scale = d ** -0.5
    win = (args.window, -1)
    pairs_w = visible_pairs(n, n, True, win) * b * h
    pairs_c = visible_pairs(n, n, True, (-1, -1)) * b * h
    tuned = fwd_config(d, q.dtype, q.device, True, False, n)
    print(f"# tuned causal forward tiles: {tuned}")

    def call(cfg, window):
        return lambda: ka.attention_fwd(q, k, v, True, scale, None, config=cfg, window=window)

    fns = {}
    cands = [c for c in FWD_CANDIDATES if c.block_m == 128 and not c.row64 and not c.rowoff]
    for cfg in cands[:: max(1, len(cands) // args.max)]:
        try:
            call(cfg, win)()
            torch.cuda.synchronize()
            fns[cfg] = call(cfg, win)
        except Exception as e:  # tiles that do not fit
            print(f"  skip {cfg}: {type(e).__name__}")
    first = interleaved_tflops(fns, 4.0 * pairs_w * d, rounds=1, round_ms=20)
    best = sorted(first, key=first.get, reverse=True)[: args.top]
    confirm = {("window", cfg): fns[cfg] for cfg in best}
    confirm[("window", "tuned")] = call(None, win)
    confirm[("causal", "tuned")] = call(None, (-1, -1))
    flops = {key: 4.0 * (pairs_c if key[0] == "causal" else pairs_w) * d for key in confirm}
    tflops = {}
    for _ in range(4):  # turns: every callable meets every clock state
        for key, fn in confirm.items():
            tflops.setdefault(key, []).append(interleaved_tflops({key: fn}, flops[key], rounds=1, round_ms=40)[key])
    for key in sorted(tflops, key=lambda key: -sorted(tflops[key])[len(tflops[key]) // 2]):
        vals = sorted(tflops[key])
        print(f"{key[0]:7s} {str(key[1]):110s} {vals[len(vals) // 2]:6.0f} TFLOPS (visible), first pass "
              f"{first.get(key[1], float('nan')):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
