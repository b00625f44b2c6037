"""Probe: does computing part of the forward's exp2s on the FMA pipe (a polynomial) instead of the MUFU
pay on Hopper? (FlashAttention-4's exp2 emulation, in plain Triton.)

    python -m bench.probes.exp2_probe      (H200 answer: bench/results/attention_exp2_probe_h200.txt)

At head_dim 64 the forward's exp2s (MUFU.EX2, 16 per clock per SM) take about as long as its matmuls
at peak rate, and Triton 3.6 does not overlap the two (bench/probes/prefetch_probe.py). A share of the score
columns is split off (a register-local reshape of the wgmma accumulator) and raised to 2^x with
FADD/FFMA/integer ops; the rest stays on the MUFU. EMU = 0: none; 1, 2, 3: a half, a quarter, an
eighth of the columns. Timed in turns with diyflash's forward on bench/probes/minimal_attention.py's kernel
(no masks, lengths a multiple of the tiles), with the max error against an fp32 reference for each
variant. A measured dead end on Hopper with Triton 3.6, kept so that it can be re-run.
"""

from __future__ import annotations

import sys

import torch

from bench.common import attention_flops, interleaved_tflops
from bench.probes.minimal_attention import run, sass

OPS = ("MUFU", "FFMA", "FADD", "FMUL", "FMNMX", "IMAD", "SHF", "IADD3", "LEA", "F2FP", "HGMMA", "STS", "LDS", "SHFL",
       "BAR")


def sass_counts(q, tiles, emu) -> str:
    """Instruction counts of the whole compiled kernel that tell where the work went."""
    ops = [op.split(".")[0] for op in sass(q, tiles, emu=emu)]
    return " ".join(f"{k}={ops.count(k)}" for k in OPS) + f" total={len(ops)}"


def main() -> int:
    if not torch.cuda.is_available():
        print("exp2_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    import diyflash

    torch.manual_seed(0)
    for b, h, d in ((4, 32, 64), (4, 16, 128)):
        cfgs = [(128, 64, 8, 3), (128, 128, 8, 3)] if d == 64 else [(128, 64, 8, 3)]
        for n in (1024, 4096, 16384):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
            fns = {"diyflash": lambda: diyflash.flash_attention(q, k, v)}
            errs = {"diyflash": (diyflash.flash_attention(q, k, v).float() - ref).abs().max().item()}
            for cfg in cfgs:
                for emu in (0, 1, 2, 3):
                    try:
                        errs[(cfg, emu)] = (run(q, k, v, *cfg, emu=emu).float() - ref).abs().max().item()
                        fns[(cfg, emu)] = (lambda cfg=cfg, emu=emu: run(q, k, v, *cfg, emu=emu))
                    except Exception as e:
                        print("fail", cfg, emu, type(e).__name__, str(e)[-700:], flush=True)
            res = interleaved_tflops(fns, attention_flops(b, h, n, n, d, False, "fwd"), rounds=4)
            print(f"D{d} N{n}: diyflash {res['diyflash']:.0f} (err {errs['diyflash']:.1e}); " + "; ".join(
                f"{c[0]} emu{c[1]} {t:.0f} ({errs[c]:.1e})" for c, t in res.items() if c != "diyflash"), flush=True)
            if n == 4096:
                for cfg in cfgs:
                    for emu in (0, 2):
                        try:
                            print(f"  SASS {cfg} emu{emu}: {sass_counts(q, cfg, emu)}", flush=True)
                        except Exception as e:
                            print("  sass fail", str(e)[-300:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
