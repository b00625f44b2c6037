# (issue 48) one query head a program (BWD_GROUP_HEADS = 1) against two on the long causal GQA backward cells, four rounds, each
# variant right after cuDNN. From the repository root: python bench/probes/drafts/bwd_one_head/cap1_ab.py
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
CELLS = {"GQA64/8 B1 N16384": (1, 64, 16384), "GQA32/8 B1 N16384": (1, 32, 16384),
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
res = {(c, p): [] for c in CELLS for p in ("cudnn", "cap2", "cap1")}
for rnd in range(4):
    for cell in CELLS:
        fns = {"cudnn": cudnn(cell)}
        caps = {"cap2": 2, "cap1": 1}
        order = ["cap2", "cap1"] if rnd % 2 == 0 else ["cap1", "cap2"]
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
    med = {p: statistics.median(res[(cell, p)]) for p in ("cudnn", "cap2", "cap1")}
    print(f"{cell:18s} cudnn {med['cudnn']:6.1f} | cap2 {med['cap2']:6.1f} ({med['cap2']/med['cudnn']:.3f}x) "
          f"[{min(res[(cell,'cap2')]):.0f}-{max(res[(cell,'cap2')]):.0f}] | cap1 {med['cap1']:6.1f} "
          f"({med['cap1']/med['cudnn']:.3f}x) [{min(res[(cell,'cap1')]):.0f}-{max(res[(cell,'cap1')]):.0f}] | cap1/cap2 {med['cap1']/med['cap2']:.3f}")
print("head_split (kv_group, max_heads) -> parts:", SEEN)
