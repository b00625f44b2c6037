"""Probe (issue 48): the Hopper backward with hopper.BWD_GROUP_HEADS = 2 (cap2) against whole query-head groups a program
(whole), each timed right after cuDNN, four rounds, the order of the two reversed every other round; run on 8d6c002's
parent tree plus the cap (before BWD_GROUP_MIN_ROWS, which applies the cap from 8192 rows only)."""
import statistics, torch, triton, diyflash
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from diyflash.kernels.attention import hopper, launch
_real = launch.head_split
SEEN = {}
def _split(*a, **k):
    r = _real(*a, **k)
    SEEN.setdefault((a[0], k.get("max_heads")), set()).add(r)
    return r
launch.head_split = _split
CELLS = {"GQA64/8 B1 N16384": (1, 64, 16384), "GQA32/8 B1 N16384": (1, 32, 16384), "GQA32/8 B4 N4096": (4, 32, 4096),
         "GQA64/8 B2 N8192": (2, 64, 8192)}
def make(b, hq, n):
    torch.manual_seed(0)
    mk = lambda h: torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return mk(hq), mk(8), mk(8)
def ours(cell):
    q, k, v = make(*CELLS[cell])
    out = diyflash.flash_attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def cudnn(cell):
    q, k, v = make(*CELLS[cell])
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def tf(cell, ms):
    b, hq, n = CELLS[cell]
    return 2.5 * 4 * b * hq * n * n * 128 / 2 / ms / 1e9
res = {(c, p): [] for c in CELLS for p in ("cudnn", "cap2", "whole")}
for rnd in range(4):
    for cell in CELLS:
        fns = {"cudnn": cudnn(cell)}
        caps = {"cap2": 2, "whole": None}
        order = ["cap2", "whole"] if rnd % 2 == 0 else ["whole", "cap2"]
        for p in order:
            res[(cell, "cudnn")].append(tf(cell, triton.testing.do_bench(fns["cudnn"], warmup=20, rep=150)))
            hopper.BWD_GROUP_HEADS = caps[p]
            diyflash.clear_caches()  # the backward's plan made again, with this cap, from a new forward
            fns["ours"] = ours(cell)
            fns["ours"]()
            torch.cuda.synchronize()
            res[(cell, p)].append(tf(cell, triton.testing.do_bench(fns["ours"], warmup=20, rep=150)))
        del fns; torch.cuda.empty_cache()
hopper.BWD_GROUP_HEADS = 2
for cell in CELLS:
    med = {p: statistics.median(res[(cell, p)]) for p in ("cudnn", "cap2", "whole")}
    print(f"{cell:18s} cudnn {med['cudnn']:6.1f} | cap2 {med['cap2']:6.1f} ({med['cap2']/med['cudnn']:.3f}x) "
          f"[{min(res[(cell,'cap2')]):.0f}-{max(res[(cell,'cap2')]):.0f}] | whole {med['whole']:6.1f} "
          f"({med['whole']/med['cudnn']:.3f}x) [{min(res[(cell,'whole')]):.0f}-{max(res[(cell,'whole')]):.0f}] | cap2/whole {med['cap2']/med['whole']:.3f}")
print("head_split (kv_group, max_heads) -> parts:", SEEN)
