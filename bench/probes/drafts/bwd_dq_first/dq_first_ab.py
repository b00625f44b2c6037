# (issue 48) the Hopper backward at head_dim 64: FlashAttention-3's order (dq issued before dk, dq's tile stored while
# dk's matmul runs; BWD_TILES' fifth field, dq_first.diff beside this file) against the kernel's (dk, then dq once dv
# and dk are done), four rounds, each right after cuDNN. With the patch applied: python dq_first_ab.py
import statistics, torch, triton, diyflash
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from diyflash.kernels.attention import hopper
CELLS = {"MHA D64 full fp16 B2 H16 N8192": (2, 16, 16, 8192, False, torch.float16),
         "MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, True, torch.float16),
         "MHA D64 full bf16 B4 H32 N4096": (4, 32, 32, 4096, False, torch.bfloat16),
         "GQA32/8 D64 causal bf16 B4 N4096": (4, 32, 8, 4096, True, torch.bfloat16)}
TILES = {"kernel": (64, 2, 2, True, False), "dq_first": (64, 2, 2, True, True)}
def make(b, h, hk, n, causal, dt):
    torch.manual_seed(0)
    q = torch.randn(b, h, n, 64, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(b, hk, n, 64, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(b, hk, n, 64, device="cuda", dtype=dt, requires_grad=True)
    return q, k, v
def ours(cell):
    b, h, hk, n, causal, dt = CELLS[cell]
    q, k, v = make(*CELLS[cell])
    out = diyflash.flash_attention(q, k, v, causal=causal)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def cudnn(cell):
    b, h, hk, n, causal, dt = CELLS[cell]
    q, k, v = make(*CELLS[cell])
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def tf(cell, ms):
    b, h, hk, n, causal, dt = CELLS[cell]
    return 2.5 * 4 * b * h * n * n * 64 / (2 if causal else 1) / ms / 1e9
# the two forms' gradients on one odd causal call: dk, dv bitwise, dq within the adds' order
torch.manual_seed(1)
x = [torch.randn(2, 4, 1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
g = torch.randn(2, 4, 1000, 64, device="cuda", dtype=torch.bfloat16)
grads = {}
for name, tiles in TILES.items():
    hopper.BWD_TILES[64] = tiles
    diyflash.clear_caches()
    hopper.use("hopper")
    o = diyflash.flash_attention(*x, causal=True)
    grads[name] = torch.autograd.grad(o, x, g)
    hopper.use("auto")
a, b = grads["kernel"], grads["dq_first"]
print("dq max |dq_first - kernel| / max|dq|:", ((a[0].float() - b[0].float()).abs().max() / a[0].float().abs().max()).item(),
      "dk equal:", torch.equal(a[1], b[1]), "dv equal:", torch.equal(a[2], b[2]), flush=True)
res = {(c, p): [] for c in CELLS for p in ("cudnn", *TILES)}
for rnd in range(4):
    for cell in CELLS:
        f_ref = cudnn(cell)
        order = list(TILES) if rnd % 2 == 0 else list(reversed(TILES))
        for p in order:
            res[(cell, "cudnn")].append(tf(cell, triton.testing.do_bench(f_ref, warmup=20, rep=150)))
            hopper.BWD_TILES[64] = TILES[p]
            diyflash.clear_caches()
            f = ours(cell); f(); torch.cuda.synchronize()
            res[(cell, p)].append(tf(cell, triton.testing.do_bench(f, warmup=20, rep=150)))
            del f
        del f_ref; torch.cuda.empty_cache()
for cell in CELLS:
    med = {p: statistics.median(res[(cell, p)]) for p in ("cudnn", *TILES)}
    rng = {p: f"[{min(res[(cell, p)]):.0f}-{max(res[(cell, p)]):.0f}]" for p in TILES}
    print(f"{cell:34s} cudnn {med['cudnn']:6.1f} | kernel {med['kernel']:6.1f} ({med['kernel']/med['cudnn']:.3f}x) {rng['kernel']}"
          f" | dq_first {med['dq_first']:6.1f} ({med['dq_first']/med['cudnn']:.3f}x) {rng['dq_first']} | ratio {med['dq_first']/med['kernel']:.3f}", flush=True)
