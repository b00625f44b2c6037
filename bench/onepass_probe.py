"""One-pass vs deterministic backward vs cuDNN (SDPA) on the GPU: correctness and medians in turns."""
import json, os, statistics, sys
from dataclasses import replace
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import diyflash
from diyflash.kernels.attention import launch as ka
from diyflash.kernels.attention_configs import bwd_config, BwdConfig
from bench.common import interleaved_times

out_rows = []


def ptr(*args, **kw):
    ka.DQ_POINTER_ATOMICS = True
    try:
        return ka.attention_bwd(*args, **kw)
    finally:
        ka.DQ_POINTER_ATOMICS = False


cells = [  # b, h, hk, n, d, causal, dtype
    (4, 32, 8, 4096, 128, True, torch.bfloat16),
    (2, 16, 16, 8192, 64, False, torch.float16),
    (2, 16, 16, 8192, 128, True, torch.float16),
]
gen = torch.Generator(device="cuda").manual_seed(0)
for b, h, hk, n, d, causal, dt in cells:
    q = torch.randn(b, h, n, d, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(b, hk, n, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(b, hk, n, d, device="cuda", dtype=dt, generator=gen)
    g = torch.randn(b, h, n, d, device="cuda", dtype=dt, generator=gen)
    scale = d ** -0.5
    out, lse = ka.attention_fwd(q, k, v, causal, scale, None)
    det = ka.attention_bwd(g, None, q, k, v, out, lse, causal, scale, None)
    one = ka.attention_bwd(g, None, q, k, v, out, lse, causal, scale, None, deterministic=False)
    cfg = bwd_config(d, dt, q.device, causal, False, n)
    qr = q.detach().clone().requires_grad_(); kr = k.detach().clone().requires_grad_(); vr = v.detach().clone().requires_grad_()
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        o_c = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, enable_gqa=hk != h)
    fns = {
        "cudnn": lambda: torch.autograd.grad(o_c, (qr, kr, vr), g, retain_graph=True),
        "det": lambda: ka.attention_bwd(g, None, q, k, v, out, lse, causal, scale, None),
        "one": lambda: ka.attention_bwd(g, None, q, k, v, out, lse, causal, scale, None, deterministic=False),
        "one_ptr": lambda: ptr(g, None, q, k, v, out, lse, causal, scale, None, deterministic=False),
    }
    alts = []
    for bm, bn, w, st in (((32, 128, 8, 3), (64, 64, 4, 2)) if d == 128 else ((64, 128, 8, 3), (64, 64, 4, 3))):
        c = replace(cfg.dkdv, block_m=bm, block_n=bn, num_warps=w, num_stages=st, split=False)
        alt = BwdConfig(c, cfg.dq)
        name = f"one_{bm}x{bn}w{w}s{st}"
        try:
            ka.attention_bwd(g, None, q, k, v, out, lse, causal, scale, None, config=alt, deterministic=False)
            fns[name] = (lambda alt=alt: ka.attention_bwd(g, None, q, k, v, out, lse, causal, scale, None, config=alt, deterministic=False))
        except Exception as e:
            print(name, "failed", type(e).__name__, str(e)[:100])
    times = interleaved_times(fns, rounds=5, round_ms=60)
    flops = 4 * b * h * n * n * d * 2.5 / (2 if causal else 1)
    med = {k_: statistics.median(t) for k_, t in times.items()}
    row = dict(cell=f"B{b} H{h}/{hk} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}", cfg=str(cfg),
               ms=med, tflops={k_: flops / m / 1e9 for k_, m in med.items()},
               vs_cudnn={k_: med["cudnn"] / m for k_, m in med.items()},
               dq_diff_one_vs_det=float((one[0].float() - det[0].float()).abs().max()),
               dkdv_equal=bool(torch.equal(one[1], det[1]) and torch.equal(one[2], det[2])),
               dq_max=float(det[0].float().abs().max()))
    out_rows.append(row)
    print(json.dumps(row), flush=True)
    del q, k, v, g, out, lse, det, one, qr, kr, vr, o_c
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "onepass.jsonl"), "w") as f:
    for r in out_rows:
        f.write(json.dumps(r) + "\n")
print("\ncell | " + " | ".join(out_rows[0]["vs_cudnn"]))
for r in out_rows:
    print(r["cell"], "|", " | ".join(f"{x:.2f}" for x in r["vs_cudnn"].values()), "| best det TF", round(r["tflops"]["det"]), "cudnn TF", round(r["tflops"]["cudnn"]))
