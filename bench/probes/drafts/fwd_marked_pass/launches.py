# (issue 48) the Hopper forward's launches, each one's GPU time under torch.profiler, against the call's do_bench
# median and cuDNN's: what the marked pass (the portable kernel's PASS 2 after the Hopper forward, semantics._fma_marked)
# costs a call when it marks nothing; and the registers of each compiled forward kernel (its residency per SM).
import sys
import torch, triton, diyflash
from torch.profiler import profile, ProfilerActivity
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from bench.cells import CELLS
from bench.common import DTYPES
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import variants  # noqa: E402
variants.apply(sys.argv[1] if len(sys.argv) > 1 else "head")

for name, (b, h, hk, n, d, causal, dname, window) in CELLS.items():
    if window is not None:
        continue
    dt = DTYPES[dname]
    torch.manual_seed(0)
    q = torch.randn(b, h, n, d, device="cuda", dtype=dt)
    k = torch.randn(b, hk, n, d, device="cuda", dtype=dt)
    v = torch.randn(b, hk, n, d, device="cuda", dtype=dt)
    f = lambda: diyflash.flash_attention(q, k, v, causal=causal)
    f(); torch.cuda.synchronize()
    ms = triton.testing.do_bench(f, warmup=20, rep=200)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        g = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        g()
        ms_cudnn = triton.testing.do_bench(g, warmup=20, rep=200)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            f()
        torch.cuda.synchronize()
    ev = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            ev[e.key] = (t / 10, e.count // 10)
    tot = sum(t for t, _ in ev.values())
    print(f"## {name}: call {1000 * ms:.1f} us (do_bench), cuDNN {1000 * ms_cudnn:.1f} us; kernels {tot:.1f} us a call",
          flush=True)
    for key, (t, c) in sorted(ev.items(), key=lambda x: -x[1][0]):
        print(f"   {t:9.1f} us  x{c}  {key[:100]}")
    del q, k, v
    torch.cuda.empty_cache()

from diyflash.kernels.attention.forward import _attn_fwd_kernel
for dev, cache in getattr(_attn_fwd_kernel, "device_caches", {}).items():
    for key, ck in cache[0].items():
        md = ck.metadata
        print(f"portable forward build: regs {ck.n_regs}, spills {ck.n_spills}, warps {md.num_warps}, shared {md.shared}",
              flush=True)
