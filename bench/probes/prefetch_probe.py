"""Probe: does issuing the next key block's q.k^T before this block's softmax let Triton overlap the
tensor cores with the exp2s? (FlashAttention-3's intra-warpgroup overlap, written as a loop whose
scores are carried one iteration ahead.)

    python -m bench.probes.prefetch_probe      (H200 answer: bench/results/attention_prefetch_probe_h200.txt)

bench/probes/minimal_attention.py's forward (no masks, lengths a multiple of the tiles) in two loop
orders: PREFETCH=False (scores of block j, then its softmax and p @ v) and PREFETCH=True (scores of
block j+1 issued, then block j's softmax and p @ v). Both are timed in turns with diyflash's forward,
and the compiled main loop's order of HGMMA, wgmma waits and MUFU.EX2 is printed for one tile each.
Not part of diyflash: a measured dead end, kept so that it can be re-run on a later Triton.
"""

from __future__ import annotations

import sys

import torch

from bench.common import attention_flops, interleaved_tflops
from bench.probes.minimal_attention import run, sass


def sass_summary(q, tiles, prefetch) -> str:
    """The order of HGMMA, wgmma waits (WAIT), MUFU.EX2 and branches in the compiled kernel (runs
    compressed: MUFUx34)."""
    names = {"HGMMA": "HGMMA", "WARPGROUP.DEPBAR": "WAIT", "MUFU.EX2": "MUFU", "BRA": "BRA",
             "WARPGROUP.ARRIVE": "WARPGROUP"}
    out = []
    for op in sass(q, tiles, prefetch=prefetch):
        t = next((name for prefix, name in names.items() if op.startswith(prefix)), None)
        if t is None:
            continue
        if out and out[-1][0] == t:
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return " ".join(f"{t}x{c}" if c > 1 else t for t, c in out)


def main() -> int:
    if not torch.cuda.is_available():
        print("prefetch_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    import diyflash

    torch.manual_seed(0)
    for b, h, d in ((4, 32, 64), (4, 16, 128)):
        for n in (1024, 4096, 16384):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
            ref = diyflash.flash_attention(q, k, v)
            fns = {"diyflash": lambda: diyflash.flash_attention(q, k, v)}
            cfgs = [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2)] if d == 64 else \
                [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 2)]
            for cfg in cfgs:
                for pf in (False, True):
                    try:
                        got = run(q, k, v, *cfg, pf)
                        err = (got.float() - ref.float()).abs().max().item()
                        if err > 1e-2:
                            print("WRONG", cfg, pf, err)
                            continue
                        fns[(cfg, pf)] = (lambda cfg=cfg, pf=pf: run(q, k, v, *cfg, pf))
                    except Exception as e:
                        print("fail", cfg, pf, type(e).__name__, str(e)[:100])
            res = interleaved_tflops(fns, attention_flops(b, h, n, n, d, False, "fwd"), rounds=4)
            base = res["diyflash"]
            print(f"D{d} N{n}: diyflash {base:.0f}; " + "; ".join(
                f"{c[0]}{' pf' if c[1] else ''} {t:.0f}" for c, t in res.items() if c != "diyflash"), flush=True)
            if n == 4096:
                for cfg in cfgs[:1]:
                    for pf in (False, True):
                        try:
                            print(f"  SASS {cfg} pf={pf}: {sass_summary(q, cfg, pf)[:600]}", flush=True)
                        except Exception as e:
                            print("  sass fail", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
