# (issue 48) the Hopper backward's p in one FMA a score (_probs_fma) against the exact form (rounded s, then s - lse2),
# in one process, variants in turns each right after cuDNN, three rounds. From the repository root, with the FMA form in
# the tree and the kernel before it at .probe2/bsm90_base.py (git show HEAD:diyflash/kernels/attention/backward_sm90.py): python bench/probes/drafts/bwd_probs_fma/fma_ab.py. Its first check calls below 2^32 work without hopper.use("hopper"): they took the portable backward under "auto", both variants the same kernels
import importlib, shutil, statistics, torch, triton, diyflash
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from diyflash.kernels.attention import hopper
shutil.copy(".probe2/bsm90_base.py", "diyflash/kernels/attention/backward_sm90_base.py")
MODS = {"exact": importlib.import_module("diyflash.kernels.attention.backward_sm90_base"),
        "fma": importlib.import_module("diyflash.kernels.attention.backward_sm90")}
CELLS = {"GQA32/8 D128 causal bf16 B4 N4096": (4, 32, 8, 4096, 128, True, torch.bfloat16),
         "GQA64/8 D128 causal bf16 B1 N16384": (1, 64, 8, 16384, 128, True, torch.bfloat16),
         "MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, True, torch.float16),
         "MHA D128 full fp16 B2 H16 N8192": (2, 16, 16, 8192, 128, False, torch.float16),
}
def use(name):
    hopper.backward_module = lambda: MODS[name]
    hopper.LAUNCHERS.pop("_hopper_bwd_kernel", None)
    diyflash.clear_caches()
    hopper.LAUNCHERS.pop("_hopper_bwd_kernel", None)
def make(b, h, hk, n, d, causal, dt):
    torch.manual_seed(0)
    mk = lambda hh: torch.randn(b, hh, n, d, device="cuda", dtype=dt, requires_grad=True)
    return mk(h), mk(hk), mk(hk)
def fn(cell, sdpa=False):
    b, h, hk, n, d, causal, dt = CELLS[cell]
    q, k, v = make(*CELLS[cell])
    if sdpa:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    else:
        out = diyflash.flash_attention(q, k, v, causal=causal)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def tf(cell, ms):
    b, h, hk, n, d, causal, dt = CELLS[cell]
    return 2.5 * 4 * b * h * n * n * d / (2 if causal else 1) / ms / 1e9
# the two forms on odd shapes: dk, dv within rounding of each other, both within the 2x rule (the GPU suite checks)
torch.manual_seed(1)
for d, dt in ((128, torch.bfloat16), (64, torch.float16)):
    x = [torch.randn(2, 4, 1000, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3)]
    g = torch.randn(2, 4, 1000, d, device="cuda", dtype=dt)
    gr = {}
    for name in MODS:
        use(name)
        o = diyflash.flash_attention(*x, causal=True, deterministic=False)
        gr[name] = torch.autograd.grad(o, x, g)
    print(f"D{d}: max |fma - exact| / max|grad|:", [round(((a.float() - b.float()).abs().max() / a.float().abs().max()).item(), 6)
                                                for a, b in zip(gr["exact"], gr["fma"])], flush=True)
res = {(c, p): [] for c in CELLS for p in ("cudnn", *MODS)}
for rnd in range(3):
    for cell in CELLS:
        f_ref = fn(cell, sdpa=True)
        for p in (list(MODS) if rnd % 2 == 0 else list(reversed(MODS))):
            res[(cell, "cudnn")].append(tf(cell, triton.testing.do_bench(f_ref, warmup=20, rep=100)))
            use(p)
            f = fn(cell); f(); torch.cuda.synchronize()
            res[(cell, p)].append(tf(cell, triton.testing.do_bench(f, warmup=20, rep=100)))
            del f
        del f_ref; torch.cuda.empty_cache()
for cell in CELLS:
    med = {p: statistics.median(res[(cell, p)]) for p in ("cudnn", *MODS)}
    rng = {p: f"[{min(res[(cell, p)]):.0f}-{max(res[(cell, p)]):.0f}]" for p in MODS}
    print(f"{cell:34s} cudnn {med['cudnn']:6.1f} | exact {med['exact']:6.1f} ({med['exact']/med['cudnn']:.3f}x) {rng['exact']}"
          f" | fma {med['fma']:6.1f} ({med['fma']/med['cudnn']:.3f}x) {rng['fma']} | fma/exact {med['fma']/med['exact']:.3f}", flush=True)
