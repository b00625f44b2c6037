"""Probe (issue 48), first look: the Hopper backward of GQA 64/8 and 32/8 D128 causal bf16 B1 N16384 with launch.head_split
and launch.head_group forced (query heads a program, head groups dealt), beside cuDNN; do_bench in three rounds, no anchor."""
import statistics, torch, triton, diyflash
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from diyflash.kernels.attention import launch
orig_split, orig_group = launch.head_split, launch.head_group
N = 16384
def make(hq):
    torch.manual_seed(0)
    mk = lambda h: torch.randn(1, h, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return mk(hq), mk(8), mk(8)
def ours(hq, parts=None, group=None):
    launch.head_split = (lambda *a, **k: parts) if parts else orig_split
    launch.head_group = (lambda causal, *a, **k: (group if causal else 1)) if group else orig_group
    diyflash.clear_caches()
    q, k, v = make(hq)
    out = diyflash.flash_attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def cudnn(hq):
    q, k, v = make(hq)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
variants = {"cudnn 64/8": (64, lambda: cudnn(64)), "64/8 default": (64, lambda: ours(64)),
            "64/8 parts2": (64, lambda: ours(64, parts=2)), "64/8 parts4": (64, lambda: ours(64, parts=4)),
            "64/8 group1": (64, lambda: ours(64, group=1)), "64/8 group8": (64, lambda: ours(64, group=8)),
            "32/8 default": (32, lambda: ours(32)), "32/8 group1": (32, lambda: ours(32, group=1)),
            "cudnn 32/8": (32, lambda: cudnn(32))}
res = {k: [] for k in variants}
for rnd in range(3):
    names = list(variants) if rnd % 2 == 0 else list(reversed(variants))
    for name in names:
        hq, mk = variants[name]
        f = mk(); f(); torch.cuda.synchronize()
        ms = triton.testing.do_bench(f, warmup=30, rep=250)
        res[name].append(2.5 * 4 * hq * N * N * 128 / 2 / ms / 1e9)
        del f; torch.cuda.empty_cache()
for name, v in res.items():
    print(f"{name:14s} " + " ".join(f"{x:6.1f}" for x in v) + f"  median {statistics.median(v):6.1f}")
launch.head_split, launch.head_group = orig_split, orig_group
