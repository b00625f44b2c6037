# (issue 48) GQA 64/8 B1 N16384's backward call ran 1.1 ms past its kernels' sum: where does the GPU idle?
import torch, triton, diyflash
from torch.profiler import profile, ProfilerActivity
for (b, h, hk, n) in [(1, 64, 8, 16384), (1, 32, 8, 16384), (2, 64, 8, 8192)]:
    torch.manual_seed(0)
    q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hk, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hk, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = diyflash.flash_attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    f = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    f(); torch.cuda.synchronize()
    s0 = torch.cuda.memory_stats()
    ms = triton.testing.do_bench(f, warmup=20, rep=200)
    s1 = torch.cuda.memory_stats()
    ms_nf = triton.testing.do_bench(f, warmup=20, rep=200, grad_to_none=None)
    # back to back without do_bench's L2 flush between calls
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3): f()
    st.record()
    for _ in range(10): f()
    en.record(); torch.cuda.synchronize()
    print(f"## B{b} H{h}/{hk} N{n}: do_bench {ms:.3f} ms; 10 back to back {st.elapsed_time(en)/10:.3f} ms a call; "
          f"device allocs {s1['num_device_alloc']-s0['num_device_alloc']}, frees {s1['num_device_free']-s0['num_device_free']}, "
          f"retries {s1['num_alloc_retries']-s0['num_alloc_retries']}, reserved {torch.cuda.memory_reserved()/2**30:.1f} GiB", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            f()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    evs.sort(key=lambda e: e.time_range.start)
    prev = None
    for e in evs[-12:]:
        gap = e.time_range.start - prev if prev is not None else 0
        print(f"   gap {gap/1000:7.3f} ms  {e.time_range.elapsed_us()/1000:7.3f} ms  {e.name[:80]}")
        prev = e.time_range.end
    api = {}
    for e in prof.key_averages():
        if e.key.startswith("cuda") or e.key.startswith("cu"):
            api[e.key] = (e.count // 3, e.cpu_time_total / 3 / 1000)
    print("   runtime API a call:", {k: (c, round(t, 3)) for k, (c, t) in api.items()})
    del q, k, v, out, do; torch.cuda.empty_cache()
