"""The Hopper forward with the scale folded into exp2's argument (FlashAttention's form: the row max over
the raw dots, then p = exp2(qk * scale - m) as one FMA a score) against the kernel (each score rounded on its
own, semantics._mul_exact, then exp2(s - m): a multiply and a subtract). Probe-only switch
hopper.FWD_VARIANT["FUSED"] (PASS + 10); the fused form is NOT safe at huge scores (|m| >= 2^24: the
argmax's exp2 argument is off by up to half an ulp of m), so this measures what the exact form costs.
Beside cuDNN, one process, in turns; each variant keeps its own plans (launch.PLANS swapped).
Run with fwd_fma_scale.patch applied: PYTHONPATH=$PWD python bench/probes/drafts/fwd_fma_scale.py"""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from diyflash.kernels.attention import hopper, launch
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
hopper.use("hopper")  # D64 on its three-consumer tiles too
prov = provenance()
rows = []
VARIANTS = {"exact": 0, "fused": 1}
saved = {}


def variant(var, args, kw):
    def run():
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        hopper.FWD_VARIANT["FUSED"] = var
        got = launch.attention_fwd(*args, **kw)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


# error against float64 on small shapes (odd lengths, masks on every path)
for B, H, Hk, Nq, Nk, D, causal, dt in [(2, 8, 2, 1000, 1000, 128, True, torch.bfloat16),
                                        (1, 4, 4, 333, 700, 128, True, torch.float16),
                                        (2, 8, 8, 1111, 1111, 128, False, torch.float16),
                                        (2, 6, 6, 777, 777, 64, False, torch.bfloat16)]:
    torch.manual_seed(0)
    q = torch.randn(B, H, Nq, D, device="cuda", dtype=dt) * 2
    k, v = (torch.randn(B, Hk, Nk, D, device="cuda", dtype=dt) for _ in range(2))
    scale = D ** -0.5
    ref = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(H // Hk, 1),
                                         v.double().repeat_interleave(H // Hk, 1), is_causal=causal,
                                         scale=scale) if Nq == Nk or not causal else None
    if ref is None:  # bottom-right causal (N_q < N_k): the mask by hand
        s = q.double() @ k.double().transpose(-1, -2) * scale
        i = torch.arange(Nq, device="cuda")[:, None] + (Nk - Nq)
        s = s.masked_fill(torch.arange(Nk, device="cuda")[None, :] > i, float("-inf"))
        ref = s.softmax(-1) @ v.double()
    errs = {}
    for vn, var in VARIANTS.items():
        saved.clear()
        out, lse = variant(var, (q, k, v, causal, scale, None), {})()
        errs[vn] = round((out.double() - ref).abs().max().item(), 6)
    row = {"run": "fma scale, errors", "cell": f"B{B} H{H}/{Hk} Nq{Nq} Nk{Nk} D{D} causal={causal} {dt}",
           "max_err_vs_float64": errs, **prov}
    rows.append(row)
    print(row["cell"], errs, flush=True)
saved.clear()

CELLS = [("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16, -1),
         ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, -1),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16, -1),
         ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16, -1),
         ("MHA D128 full bf16 B4 H32 N4096", 4, 32, 32, 4096, 128, False, torch.bfloat16, -1),
         ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, 4096),
         ("MHA D64 full fp16 B2 H16 N8192 (=hopper)", 2, 16, 16, 8192, 64, False, torch.float16, -1),
         ("MHA D64 causal fp16 B2 H16 N8192 (=hopper)", 2, 16, 16, 8192, 64, True, torch.float16, -1)]
for name, B, H, Hk, N, D, causal, dt, w in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H), mk(Hk), mk(Hk)
    scale = D ** -0.5
    fns = {}
    if w < 0:
        fns["cudnn"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    kw = {} if w < 0 else {"window": (w, 0)}
    args = (q, k, v, causal, scale, None)
    for vn, var in VARIANTS.items():
        fns[vn] = variant(var, args, kw)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        outs = {kk: fn()[0] if kk != "cudnn" else fn() for kk, fn in fns.items()}
        diff = round((outs["fused"].float() - outs["exact"].float()).abs().max().item(), 5)
        times = interleaved_times(fns, rounds=5, round_ms=60)
    saved.clear()
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    if w >= 0:
        flops = 4 * B * H * D * (N * (w + 1) - w * (w + 1) / 2)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    base = res.get("cudnn", res["exact"])
    row = {"run": "fma scale", "cell": name, "tflops": {kk: round(x, 1) for kk, x in res.items()},
           "vs_cudnn": {kk: round(x / base, 3) for kk, x in res.items()} if "cudnn" in res else None,
           "fused_vs_exact": round(res["fused"] / res["exact"], 3), "max_diff_fused_exact": diff, **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {x:.0f} ({x / base:.3f}x)" for kk, x in res.items()),
          f"fused/exact {res['fused'] / res['exact']:.3f} diff {diff}", flush=True)
with open(os.path.join(OUT, "fwd_fma_scale.jsonl"), "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
