"""Probe (issue 25: where a split decode step's GPU time goes): the GPU time of one eager-shaped decode call
(clean-L2 graph replay, bench.common.clean_graph_ms) per cell, with the registers and spills of each of its
launches' compiled kernels (decode, then combine where split). Written to compare a merge of the splits
inside the decode launch (the last split of a tile to take a ticket merging them) with the combine
launch: run it in both trees (bench/results/decode_merge_probe_h200.txt). H = 32, H_kv = 8, D = 128,
bf16, q length 1 (bench.decode's), contiguous and paged (page 256) caches.
    python -m bench.probes.merge_probe"""

from __future__ import annotations

import statistics

import torch

import diyflash
from bench.common import clean_graph_ms
from bench.decode import D, H, H_KV, shuffled_pages
from diyflash.kernels.attention import kvcache as kv

CELLS = [(1, 8192, False), (1, 8192, True), (1, 65536, False), (1, 65536, True), (8, 8192, False), (8, 8192, True)]


def _regs() -> str:
    plans = list(kv._KV_PLANS.values())
    if not plans:
        return "-"
    return " ".join(f"{b.compiled.n_regs}r/{b.compiled.n_spills}s" for b, _ in plans[-1].launches)


def main() -> None:
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | clean-L2 graph replay, median of 3 x 60")
    for b, n, paged in CELLS:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, H_KV, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(b, H_KV, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        table = None
        if paged:
            k, v, table = shuffled_pages(k, v)
        kv._KV_PLANS.clear()
        fn = lambda: diyflash.flash_attention_with_kvcache(q, k, v, lens, block_table=table, validate=False)  # noqa: E731
        fn()
        us = statistics.median(clean_graph_ms([fn]) * 1e3 for _ in range(3))
        tbps = 2 * b * n * H_KV * D * 2 / (us * 1e-6) / 1e12
        print(f"B{b} L{n} {'paged' if paged else 'contig'}: {us:6.1f} us {tbps:4.2f} TB/s [{_regs()}]")


if __name__ == "__main__":
    main()
