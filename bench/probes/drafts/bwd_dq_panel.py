"""The Hopper backward's dq tile stored in panels of 32, 16 or 8 fp32 columns (hopper.BWD_DQ_PANEL: 128-byte rows,
128-byte swizzle, the kernel; 64-byte rows, 64-byte swizzle; 32-byte rows, 32-byte swizzle), each panel one TMA
reduce. ncu counts a 2-way bank conflict at every 64-bit store of dq into 128-byte rows (a half-warp's rows r and
r^1 meet the same chunks); 32-byte rows put a half-warp's four rows in one 128-byte line. Beside cuDNN, one process,
in turns; each variant keeps its own plans (launch.PLANS swapped). Errors against the deterministic portable
backward. Run with bwd_dq_panel.patch applied: PYTHONPATH=$PWD python bench/probes/drafts/bwd_dq_panel.py"""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from diyflash.kernels.attention import hopper, launch
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
CELLS = [("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16),
         ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16),
         ("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16),
         ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16),
         ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16)]
VARIANTS = {"panel32": 32, "panel16": 16, "panel8": 8}
saved = {}
for name, B, H, Hk, N, D, causal, dt in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v, dout = mk(H), mk(Hk), mk(Hk), mk(H)
    scale = D ** -0.5
    out, lse = launch.attention_fwd(q, k, v, causal, scale, None)
    ref = launch.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, deterministic=True)
    qc, kc, vc = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal, enable_gqa=True)

    def variant(var):
        def run():
            launch.PLANS.clear()
            launch.PLANS.update(saved.get(var, {}))
            hopper.BWD_DQ_PANEL = var
            got = launch.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, deterministic=False)
            if var not in saved:
                saved[var] = dict(launch.PLANS)
            return got
        return run
    fns = {"cudnn": lambda: torch.autograd.grad(oc, (qc, kc, vc), dout, retain_graph=True)}
    for vn, var in VARIANTS.items():
        fns[vn] = variant(var)
    errs = {}
    for kk, fn in fns.items():
        if kk != "cudnn":
            got = fn()
            errs[kk] = [round((a.float() - b.float()).abs().max().item(), 5) for a, b in zip(got, ref)]
    saved.clear()
    times = interleaved_times(fns, rounds=5, round_ms=60)
    flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    row = {"run": "dq panels", "cell": name, "tflops": {kk: round(x, 1) for kk, x in res.items()},
           "vs_cudnn": {kk: round(x / res["cudnn"], 3) for kk, x in res.items()}, "max_err_vs_deterministic": errs,
           **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {x:.0f} ({x / res['cudnn']:.3f}x)" for kk, x in res.items()), "| errs", errs, flush=True)
with open(os.path.join(OUT, "bwd_dq_panel.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
