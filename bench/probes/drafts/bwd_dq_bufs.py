"""The Hopper backward's dq halves (in their registers' order, one flat chunk a warpgroup) in two buffers a
warpgroup in turns (probe-only switch hopper.BWD_VARIANT["FLAT_BUFS"]), so that a step's stores need not wait
for the step before's TMA reduces, against one (the kernel). Two fit in shared memory now: 231 KB at D128 (of
227 KiB = 232,448 bytes), 133 KB at D64. Beside cuDNN, one process, in turns; each variant keeps its own plans
(launch.PLANS swapped). Errors against the deterministic portable backward, first on odd shapes.
Run with bwd_dq_bufs.patch applied: PYTHONPATH=$PWD python bench/probes/drafts/bwd_dq_bufs.py"""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from diyflash.kernels.attention import hopper, launch
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
hopper.use("hopper")  # the Hopper backward on the odd shapes too (short calls, D64 under 1024 rows)
prov = provenance()
rows = []
VARIANTS = {"bufs1": 1, "bufs2": 2}
saved = {}


def variant(var, args, kw):
    def run():
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        hopper.BWD_VARIANT["FLAT_BUFS"] = var
        got = launch.attention_bwd(*args, deterministic=False, **kw)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


# correctness on odd shapes: N_q not a multiple of 64, N_q != N_k causal, GQA head split (small grid), D64
ODD = [(2, 8, 2, 1000, 1000, 128, True, torch.bfloat16), (1, 4, 4, 333, 700, 128, True, torch.float16),
       (1, 16, 4, 1500, 1500, 128, False, torch.bfloat16), (2, 8, 8, 1111, 1111, 64, False, torch.float16),
       (1, 32, 8, 4096, 4096, 128, True, torch.bfloat16)]
for B, H, Hk, Nq, Nk, D, causal, dt in ODD:
    torch.manual_seed(0)
    q = torch.randn(B, H, Nq, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, Hk, Nk, D, device="cuda", dtype=dt) for _ in range(2))
    dout = torch.randn_like(q)
    scale = D ** -0.5
    out, lse = launch.attention_fwd(q, k, v, causal, scale, None)
    args = (dout, None, q, k, v, out, lse, causal, scale, None)
    ref = launch.attention_bwd(*args, deterministic=True)
    errs = {}
    for vn, var in VARIANTS.items():
        saved.clear()
        got = variant(var, args, {})()
        errs[vn] = [round((a.float() - b.float()).abs().max().item(), 5) for a, b in zip(got, ref)]
    row = {"run": "dq buffers a warpgroup, odd shapes", "cell": f"B{B} H{H}/{Hk} Nq{Nq} Nk{Nk} D{D} causal={causal} {dt}",
           "max_err_vs_deterministic": errs, **prov}
    rows.append(row)
    print(row["cell"], errs, flush=True)
saved.clear()

CELLS = [("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16),
         ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16),
         ("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16),
         ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16),
         ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16)]
for name, B, H, Hk, N, D, causal, dt in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v, dout = mk(H), mk(Hk), mk(Hk), mk(H)
    scale = D ** -0.5
    out, lse = launch.attention_fwd(q, k, v, causal, scale, None)
    args = (dout, None, q, k, v, out, lse, causal, scale, None)
    ref = launch.attention_bwd(*args, deterministic=True)
    qc, kc, vc = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal, enable_gqa=True)
    fns = {"cudnn": lambda: torch.autograd.grad(oc, (qc, kc, vc), dout, retain_graph=True)}
    for vn, var in VARIANTS.items():
        fns[vn] = variant(var, args, {})
    errs = {}
    for kk, fn in fns.items():
        if kk != "cudnn":
            got = fn()
            errs[kk] = [round((a.float() - b.float()).abs().max().item(), 5) for a, b in zip(got, ref)]
    times = interleaved_times(fns, rounds=5, round_ms=60)
    saved.clear()
    flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    row = {"run": "dq buffers a warpgroup", "cell": name, "tflops": {kk: round(x, 1) for kk, x in res.items()},
           "vs_cudnn": {kk: round(x / res["cudnn"], 3) for kk, x in res.items()},
           "bufs2_vs_bufs1": round(res["bufs2"] / res["bufs1"], 3), "max_err_vs_deterministic": errs, **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {x:.0f} ({x / res['cudnn']:.3f}x)" for kk, x in res.items()),
          f"bufs2/bufs1 {res['bufs2'] / res['bufs1']:.3f}", "| errs", errs, flush=True)
with open(os.path.join(OUT, "bwd_dq_bufs.jsonl"), "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
