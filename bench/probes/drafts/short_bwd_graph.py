"""PYTHONPATH=$PWD python bench/probes/drafts/short_bwd_graph.py (its cells edited per run): hopper.BWD_MIN_ROWS at head_dim 64: the Hopper backward against the portable kernels (deterministic=False) at
1024-2048 query rows a program, GPU time only (triton.testing.do_bench_cudagraph of launch.attention_bwd), beside
cuDNN's backward; each variant its own plans, rounds alternating."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton
from bench.common import provenance, attention_flops
from diyflash.kernels.attention import hopper, launch

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows, saved = [], {}


def variant(var, args):
    def run():
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        hopper.BWD_MIN_ROWS.clear()
        hopper.BWD_MIN_ROWS.update({64: 0} if var == "hopper" else {64: 1 << 30})
        got = launch.attention_bwd(*args, deterministic=False)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


for B, H, N, causal in [(32, 16, 512, True), (32, 16, 512, False), (16, 16, 768, True), (16, 16, 768, False),
                        (64, 16, 256, True)]:
    D, dt = 64, torch.float16
    saved.clear()
    q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(4))
    scale = D ** -0.5
    out, lse = launch.attention_fwd(q, k, v, causal, scale, None)
    args = (dout, None, q, k, v, out, lse, causal, scale, None)
    qc, kc, vc = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)
    fns = {"hopper": variant("hopper", args), "portable": variant("portable", args)}
    for f in fns.values():
        f(); f()
    torch.cuda.synchronize()
    ms = {n: [] for n in fns}
    for r in range(3):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            try:
                ms[n].append(triton.testing.do_bench_cudagraph(fns[n], rep=30))
            except Exception as e:  # noqa: BLE001
                print(n, "capture failed:", type(e).__name__, str(e)[:120], flush=True)
                torch.cuda.synchronize()
                ms[n].append(float("inf"))
    flops = attention_flops(B, H, N, N, D, causal, "bwd")
    tf = {n: flops / sorted(t)[1] / 1e9 for n, t in ms.items()}
    cell = f"MHA D64 {'causal' if causal else 'full'} fp16 B{B} H{H} N{N} ({N} rows a program)"
    rows.append(dict(prov, run="short backward, GPU time", cell=cell, tflops=tf))
    print(f"{cell}: " + " ".join(f"{n} {v:.0f}" for n, v in tf.items()) +
          f" | hopper/portable {tf['hopper'] / tf['portable']:.3f}", flush=True)
json.dump(rows, open(os.path.join(OUT, "short_bwd_graph.json"), "w"), indent=1, default=str)
