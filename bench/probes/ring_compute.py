"""Probe (issue 27, on one GPU): the compute side of ring attention. Runs one rank's share of a W-rank
zigzag ring (its (q chunk, kv chunk) attention calls, merges and the backward's accumulations) with the
communication replaced by local copies, and compares its per-GPU TFLOPS with single-GPU diyflash on
N / W tokens. This bounds what the ring reaches when its sends overlap perfectly; the sends themselves
need the 2-GPU machine. B1 H32 H_kv 8 D128 bf16 causal, forward + backward.
    python -m bench.probes.ring_compute [--n 131072] [--world 2]"""

from __future__ import annotations

import argparse

import torch

import diyflash
import diyflash.distributed.layout as layout_mod
import diyflash.distributed.ring as ring_mod
from diyflash.utils.benchmark import benchmark_fn


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=131072)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    n, w = args.n, args.world
    b, h, h_kv, d = 1, 32, 8, 128
    flops_total = 4 * b * h * n * n * d / 2 * 3.5  # causal forward + backward (2.5x)
    print(f"# {torch.cuda.get_device_name()} | B{b} H{h}/{h_kv} D{d} bf16 causal | N {n} over {w} ranks (zigzag)")

    def shard(heads):
        return torch.randn(b, heads, n // w, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = shard(h), shard(h_kv), shard(h_kv)
    g = torch.randn_like(q)
    single = benchmark_fn(lambda q, k, v: torch.autograd.grad(diyflash.flash_attention(q, k, v, causal=True),
                                                              (q, k, v), g), q, k, v, warmup=3, rep=10)[0]
    # the same shard sizes, but as rank r of a W-rank ring: comm replaced by local copies
    rows = []
    for rank in range(w):
        ring_mod.world = layout_mod.world = lambda group, rank=rank: (rank, w)
        ring_mod.ring_shift = lambda ts, group, forward=True: ([t.clone() for t in ts], [])
        ms = benchmark_fn(lambda q, k, v: torch.autograd.grad(
            diyflash.distributed.ring_attention(q, k, v, True), (q, k, v), g), q, k, v, warmup=2, rep=5)[0]
        rows.append(ms)
    single_tflops = 4 * b * h * (n // w) ** 2 * d / 2 * 3.5 / single / 1e9
    print(f"single GPU, N {n // w}: {single:.1f} ms, {single_tflops:.0f} TFLOPS")
    for rank, ms in enumerate(rows):
        tf = flops_total / w / ms / 1e9
        print(f"ring rank {rank} of {w}, N {n}: {ms:.1f} ms, {tf:.0f} TFLOPS per GPU = {tf / single_tflops:.2f}x single")


if __name__ == "__main__":
    main()
