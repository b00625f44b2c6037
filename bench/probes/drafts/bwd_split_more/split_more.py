# (issue 48) does a window or a non-causal GQA backward gain from two query heads a program, as the long causal one
# did? Forces launch.head_split's max_heads=2 (cap2) against the rule (whole), four rounds in turns, each right after
# cuDNN (the window: none). From the repository root: python bench/probes/drafts/bwd_split_more/split_more.py
import statistics, torch, triton, diyflash
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from diyflash.kernels.attention import launch
_real = launch.head_split
SEEN = {}
CAP = [None]
def _split(*a, **k):
    if CAP[0] is not None:
        k["max_heads"] = CAP[0]
    r = _real(*a, **k)
    SEEN.setdefault((CAP[0], k.get("max_heads")), set()).add(r)
    return r
launch.head_split = _split
# name: (batch, hq, n, causal, window)
CELLS = {"window4096 GQA32/8 B1 N16384": (1, 32, 16384, True, 4096),
         "full GQA32/8 B1 N16384": (1, 32, 16384, False, None),
         "full GQA64/8 B1 N8192": (1, 64, 8192, False, None)}
def make(b, hq, n):
    torch.manual_seed(0)
    mk = lambda h: torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return mk(hq), mk(8), mk(8)
def ours(cell):
    b, hq, n, causal, w = CELLS[cell]
    q, k, v = make(b, hq, n)
    kw = {"window_size": (w - 1, 0)} if w else {}
    out = diyflash.flash_attention(q, k, v, causal=causal, **kw)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def cudnn(cell):
    b, hq, n, causal, w = CELLS[cell]
    q, k, v = make(b, hq, n)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def flops(cell):
    b, hq, n, causal, w = CELLS[cell]
    if w:
        pairs = sum(min(i + 1, w) for i in range(n))
    else:
        pairs = n * n / 2 if causal else n * n
    return 2.5 * 4 * b * hq * pairs * 128
res = {(c, p): [] for c in CELLS for p in ("cudnn", "cap2", "whole")}
for rnd in range(4):
    for cell in CELLS:
        win = CELLS[cell][4]
        f_ref = None if win else cudnn(cell)
        order = ["cap2", "whole"] if rnd % 2 == 0 else ["whole", "cap2"]
        for p in order:
            if f_ref:
                res[(cell, "cudnn")].append(flops(cell) / triton.testing.do_bench(f_ref, warmup=20, rep=150) / 1e9)
            CAP[0] = 2 if p == "cap2" else None
            diyflash.clear_caches()
            f = ours(cell); f(); torch.cuda.synchronize()
            res[(cell, p)].append(flops(cell) / triton.testing.do_bench(f, warmup=20, rep=150) / 1e9)
            del f
        del f_ref; torch.cuda.empty_cache()
CAP[0] = None
for cell in CELLS:
    med = {p: statistics.median(res[(cell, p)]) if res[(cell, p)] else float("nan") for p in ("cudnn", "cap2", "whole")}
    print(f"{cell:30s} cudnn {med['cudnn']:6.1f} | cap2 {med['cap2']:6.1f} [{min(res[(cell,'cap2')]):.0f}-{max(res[(cell,'cap2')]):.0f}]"
          f" | whole {med['whole']:6.1f} [{min(res[(cell,'whole')]):.0f}-{max(res[(cell,'whole')]):.0f}] | cap2/whole {med['cap2']/med['whole']:.3f}")
print("head_split (forced cap, max_heads) -> parts:", SEEN)
