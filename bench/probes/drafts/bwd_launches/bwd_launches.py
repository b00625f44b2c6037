# (issue 48) the backward's launches, each one's GPU time, against the whole call's time (Hopper backward, default)
import statistics, torch, triton, diyflash
from torch.profiler import profile, ProfilerActivity
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
CELLS = {"GQA64/8 D128 causal bf16 B1 N16384": (1, 64, 8, 16384, 128, True, torch.bfloat16),
         "GQA32/8 D128 causal bf16 B4 N4096": (4, 32, 8, 4096, 128, True, torch.bfloat16),
         "MHA D128 full fp16 B2 H16 N8192": (2, 16, 16, 8192, 128, False, torch.float16),
         "MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, True, torch.float16)}
for name, (b, h, hk, n, d, causal, dt) in CELLS.items():
    torch.manual_seed(0)
    q = torch.randn(b, h, n, d, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(b, hk, n, d, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(b, hk, n, d, device="cuda", dtype=dt, requires_grad=True)
    out = diyflash.flash_attention(q, k, v, causal=causal)
    do = torch.randn_like(out)
    f = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    f(); torch.cuda.synchronize()
    ms = triton.testing.do_bench(f, warmup=20, rep=200)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o2 = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    g = lambda: torch.autograd.grad(o2, (q, k, v), do, retain_graph=True)
    ms_cudnn = triton.testing.do_bench(g, warmup=20, rep=200)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            f()
        torch.cuda.synchronize()
    ev = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "device_time_total", 0) > 0:
            t = getattr(e, "device_time_total", None) or e.cuda_time_total
            if t: ev[e.key] = (t / 5 / 1000, e.count // 5)
    tot = sum(t for t, _ in ev.values())
    print(f"## {name}: call {ms:.3f} ms (do_bench), cuDNN {ms_cudnn:.3f} ms; kernels {tot:.3f} ms a call", flush=True)
    for key, (t, c) in sorted(ev.items(), key=lambda x: -x[1][0]):
        print(f"   {t:8.3f} ms  x{c}  {key[:110]}")
    del q, k, v, out, do, o2; torch.cuda.empty_cache()
