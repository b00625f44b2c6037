"""How the order of a causal kernel's tiles pays: the attention kernels timed with each head group.

    python -m bench.probes.attention_groups [--head-dims 64 128 256] [--n 2048 4096 8192 16384] [--dtype fp16]
                                     [--groups 1 2 4 8 16 32 64 128] [--out rows.jsonl]

A causal forward (or dq) tile's work grows with its query block, a dk/dv tile's falls with its key
block. The kernels deal tiles out over groups of heads (kernels.attention.semantics._tile): rank r of every head
in a group before rank r + 1, so the heavy tiles start first and the grid ends on light ones; a group
of 1 goes head after head, each head heavy to light, and the grid ends on whatever the last heads
left. Larger groups balance better and share L2 less. For each shape (the benchmark's B and H per
head_dim) this times the forward and the whole backward (both kernels dealt alike) with every group,
and with the launchers' own choice ("auto": kernels.attention.head_group, per kernel), in
interleaved rounds. Rows with group null are the launchers' choice.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from bench.attention_configs import SHAPES
from bench.common import DTYPES, attention_flops, interleaved_times, provenance, quantiles


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--n", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--out", default=None, help="append the rows here (JSONL)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_groups: needs a CUDA GPU", file=sys.stderr)
        return 2

    from diyflash.kernels.attention import launch as ka

    dtype = DTYPES[args.dtype]
    prov = provenance()
    print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']} | causal, {args.dtype}; "
          "TFLOPS per head group (auto: the launchers' choice)")
    rows = []
    for d in args.head_dims:
        b, h = SHAPES.get(d, (2, 8))
        for n in args.n:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, dout = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
            scale = d ** -0.5
            out, lse = ka.attention_fwd(q, k, v, True, scale, None)
            groups = [g for g in args.groups if g <= b * h] + [None]  # None: the launchers' own choice
            fns = {}
            for g in groups:
                fns[("fwd", g)] = lambda g=g: ka.attention_fwd(q, k, v, True, scale, None, group=g)
                fns[("bwd", g)] = lambda g=g: ka.attention_bwd(dout, None, q, k, v, out, lse, True, scale, None, group=g)
            for fn in fns.values():  # compile, and settle the allocator
                fn()
            torch.cuda.synchronize()
            times = interleaved_times(fns, rounds=5, round_ms=40)
            line = []
            for (mode, g), t in times.items():
                ms, p20, p80 = quantiles(t)
                flops = attention_flops(b, h, n, n, d, True, mode)
                rows.append(dict(prov, mode=mode, head_dim=d, n=n, b=b, h=h, dtype=args.dtype, causal=True,
                                 group=g, ms=ms, p20_ms=p20, p80_ms=p80, tflops=flops / ms / 1e9))
                line.append(f"{mode} {'g' + str(g) if g else 'auto'} {flops / ms / 1e9:.0f}")
            print(f"D{d} N{n}: " + "  ".join(line), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
