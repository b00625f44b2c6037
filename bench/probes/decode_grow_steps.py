"""Probe: host per decode step, 4 layers, each step's caches one token longer by torch.cat (a DynamicCache, as in
transformers' generate): flash_attention's decode route against SDPA in turns, B1 and B8; prints one line.
    PYTHONPATH=<tree> python bench/probes/decode_grow_steps.py TAG   (processes of two trees alternating)"""
import os, statistics, sys, time, torch, torch.nn.functional as F, diyflash
from diyflash.kernels import _cplan
_cplan.ready()
tag = sys.argv[1]
res = []
for B in (1, 8):
    L, H, HKV, D, N0 = 4, 32, 8, 128, 4096
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    ours = lambda q, k, v: diyflash.flash_attention(q, k, v, causal=True)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    def run(fn, steps):
        caches = [[torch.randn(B, HKV, N0, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)] for _ in range(L)]
        new = torch.randn(B, HKV, 1, D, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(steps):
            for c in caches:
                c[0] = torch.cat([c[0], new], dim=2)
                c[1] = torch.cat([c[1], new], dim=2)
                fn(q, c[0], c[1])
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e6
    for fn in (ours, sdpa):
        run(fn, 50)
    t = {"ours": [], "sdpa": []}
    for _ in range(7):
        for name, fn in (("ours", ours), ("sdpa", sdpa)):
            t[name].append(run(fn, 100))
    o, s = statistics.median(t["ours"]), statistics.median(t["sdpa"])
    res.append(f"B{B}: ours {o:.1f} us/step, sdpa {s:.1f}, ratio {o / s:.3f}")
print(f"{tag}: " + " | ".join(res), flush=True)
