"""Probe: decode kernel tiles and split counts at B1 (launch-latency bound) and B8, GPU time of a CUDA graph
replay. python -m bench.probes.decode_probe"""

import torch

import diyflash
from diyflash.kernels.attention import kvcache
from bench.common import graph_ms

H, H_KV, D = 32, 8, 128
for b, n in ((1, 8192), (1, 65536), (8, 8192)):
    q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, H_KV, n, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    sl = torch.full((b,), n, dtype=torch.int32, device="cuda")
    cells = []
    for block_n in (32, 64, 128):
        kvcache.DECODE_BLOCK_N = block_n
        for splits in (0, 8, 16, 32, 64, 128):
            us = graph_ms(lambda: diyflash.flash_attention_with_kvcache(q, k, v, sl, num_splits=splits, validate=False)) * 1e3
            cells.append((us, block_n, splits))
    cells.sort()
    kvcache.DECODE_BLOCK_N = 64
    print(f"B{b} L{n}: best " + ", ".join(f"{us:.1f}us (BN{bn}, S{s})" for us, bn, s in cells[:5])
          + f"; default BN64 S0: {[c[0] for c in cells if c[1:] == (64, 0)][0]:.1f}us")
