"""Up to how much work a bf16 forward runs one pass on the prescaled q (launch.PRESCALED_MAX_WORK) instead of
the raw pass and the rescue pass: GPU-only time (graph replay) of both ways per cell, and the eager call's
host time, in turns.

    python -m bench.prescaled_probe [--out F.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from bench.common import graph_ms, provenance
from bench.overhead import host_us
from bench.plots import write_jsonl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import diyflash
    from diyflash.kernels.attention import launch

    prov = dict(provenance(), command="python -m bench.prescaled_probe")
    rows = []
    cells = [(1, 32, 128, 128, False), (1, 32, 256, 128, True), (1, 32, 256, 128, False), (1, 32, 512, 128, True),
             (1, 32, 512, 128, False), (1, 32, 1024, 128, True), (2, 32, 1024, 128, False), (4, 16, 1024, 64, True),
             (4, 32, 1024, 64, False)]
    ways = {"one prescaled pass": 1 << 62, "two passes": 0}
    print("bf16 forward: GPU us (graph replay) and host us per eager call, one prescaled pass against two passes")
    for b, h, n, d, causal in cells:
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        work = b * h * n * n * d
        samples = {way: ([], []) for way in ways}
        for _ in range(args.rounds):
            for way, limit in ways.items():
                launch.PRESCALED_MAX_WORK = limit
                diyflash.clear_caches()
                fn = lambda: diyflash.flash_attention(q, q, q, causal=causal)  # noqa: E731
                fn()
                samples[way][0].append(graph_ms(fn, warm_calls=3) * 1e3)
                samples[way][1].append(host_us(fn, reps=60))
        cell = f"B{b} H{h} N{n} D{d} causal={causal}"
        line = []
        for way, (gpu, host) in samples.items():
            g, t = statistics.median(gpu), statistics.median(host)
            rows.append(dict(prov, table="prescaled", shape=cell, work_log2=work.bit_length() - 1, way=way, gpu_us=g,
                             host_us=t))
            line.append(f"{way}: GPU {g:6.1f} host {t:6.1f}")
        print(f"  {cell:<30} 2^{work.bit_length() - 1:<3} " + " | ".join(line), flush=True)
    if args.out:
        write_jsonl(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
