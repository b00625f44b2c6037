"""Where the host time of the attention backward goes, for short sequences where it exceeds the GPU's.

    python -m bench.probes.backward_host      (one line per shape, then a profiler table of one shape; the
                                        Chrome trace goes to $OUT/bwd_trace.json, else /tmp)

Per shape (fp16, microseconds, medians): host time of torch.autograd.grad (`grad`: 20 calls enqueued
back to back) and its do_bench time; the same with the backward on the calling thread
(torch.autograd.set_multithreading_enabled(False)); SDPA's; torch.ops.diyflash.attention_bwd and the
bare launcher alone; and the three phases of one autograd.grad call (until the launcher starts, inside
it, after it), synchronized per call. Results: bench/results/attention_bwd_host_h200.txt.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from bench.overhead import host_us

SHAPES = ((1, 1, 128, 64), (16, 32, 128, 64), (16, 16, 256, 128), (16, 8, 512, 256))  # B, H, N, D


def phases(fn, stamps: dict, reps: int = 200) -> tuple[float, float, float]:
    """Median (call -> launcher entry, inside the launcher, launcher exit -> return) of fn, in us."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    before, inside, after = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        before.append((stamps["enter"] - t0) * 1e6)
        inside.append((stamps["exit"] - stamps["enter"]) * 1e6)
        after.append((t1 - stamps["exit"]) * 1e6)
        torch.cuda.synchronize()
    return tuple(round(statistics.median(x), 1) for x in (before, inside, after))


def main() -> int:
    import triton

    import diyflash
    from diyflash.kernels.attention import launch as ka

    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    launcher = ka.attention_bwd
    stamps: dict = {}

    def timed_launcher(*args, **kwargs):  # the op's implementation looks the launcher up per call
        stamps["enter"] = time.perf_counter()
        result = launcher(*args, **kwargs)
        stamps["exit"] = time.perf_counter()
        return result

    ka.attention_bwd = timed_launcher
    bench = lambda fn: triton.testing.do_bench(fn, warmup=50, rep=100) * 1e3  # noqa: E731
    try:
        for b, h, n, d in SHAPES:
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True)
                           for _ in range(3))
                out = diyflash.flash_attention(q, k, v, causal=causal)
                dout = torch.randn_like(out)
                out_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o, lse = torch.ops.diyflash.attention_fwd(q.detach(), k.detach(), v.detach(), causal, None, None)
                qd, kd, vd = q.detach(), k.detach(), v.detach()
                calls = {
                    "grad": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                    "sdpa_grad": lambda: torch.autograd.grad(out_sdpa, (q, k, v), dout, retain_graph=True),
                    "op_bwd": lambda: torch.ops.diyflash.attention_bwd(dout, None, qd, kd, vd, o, lse, causal, None, None),
                    "launcher": lambda: launcher(dout, None, qd, kd, vd, o, lse, causal, d ** -0.5, None),
                }
                res = {name: host_us(fn) for name, fn in calls.items()}
                res.update({f"{name}_bench": bench(calls[name]) for name in ("grad", "sdpa_grad", "launcher")})
                with torch.autograd.set_multithreading_enabled(False):
                    res["grad_1thr"] = host_us(calls["grad"])
                    res["grad_1thr_bench"] = bench(calls["grad"])
                    one_thread = phases(calls["grad"], stamps)
                threaded = phases(calls["grad"], stamps)
                print(f"B{b} H{h} N{n} D{d} causal={int(causal)}: "
                      + " ".join(f"{name}={us:.0f}" for name, us in res.items())
                      + f" | phases(thread) {threaded} | phases(1thr) {one_thread}", flush=True)
    finally:
        ka.attention_bwd = launcher
    profile_one(diyflash)
    return 0


def profile_one(diyflash, b=16, h=32, n=128, d=64) -> None:
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    out = diyflash.flash_attention(q, k, v)
    dout = torch.randn_like(out)
    for _ in range(10):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
    prof.export_chrome_trace(os.path.join(os.environ.get("OUT", "/tmp"), "bwd_trace.json"))


if __name__ == "__main__":
    sys.exit(main())
