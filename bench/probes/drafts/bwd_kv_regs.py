"""The Hopper backward at head_dim 64 with each MMA warpgroup's k and v held in registers as s^T's and dp^T's A
operands ("kvregs": hopper.BWD_TILES[64] with KV_REGS), against reading them from shared memory every step
("now"). At head_dim 128 they do not fit: offline sm_90a builds spill 560-684 B and serialize every wgmma.
Beside cuDNN, one process, in turns (two passes); each variant keeps its own plans (launch.PLANS swapped).
Errors against the deterministic portable backward, first on odd shapes.
PYTHONPATH=$PWD python bench/probes/drafts/bwd_kv_regs.py"""
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import interleaved_times, provenance, quantiles
from diyflash.kernels.attention import hopper, launch

OUT = os.environ.get("OUT", "/tmp")
hopper.use("hopper")  # the Hopper backward on the odd shapes too (D64 under 1024 rows)
prov = provenance()
rows = []
BASE = hopper.BWD_TILES[64][:3]
VARIANTS = {"now": False, "kvregs": True}
saved = {}


def variant(var, args, kw):
    def run():
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        hopper.BWD_TILES[64] = BASE + (VARIANTS[var],)
        got = launch.attention_bwd(*args, deterministic=False, **kw)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


ODD = [(2, 8, 2, 1000, 1000, True, torch.bfloat16), (1, 4, 4, 333, 700, True, torch.float16),
       (1, 16, 4, 1500, 1500, False, torch.bfloat16), (2, 8, 8, 1111, 1111, False, torch.float16),
       (1, 4, 4, 64, 64, True, torch.float16), (1, 4, 4, 1, 17, False, torch.float16)]
for B, H, Hk, Nq, Nk, causal, dt in ODD:
    D = 64
    torch.manual_seed(0)
    q = torch.randn(B, H, Nq, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, Hk, Nk, D, device="cuda", dtype=dt) for _ in range(2))
    dout = torch.randn_like(q)
    scale = D ** -0.5
    out, lse = launch.attention_fwd(q, k, v, causal, scale, None)
    args = (dout, None, q, k, v, out, lse, causal, scale, None)
    ref = launch.attention_bwd(*args, deterministic=True)
    errs = {}
    for vn in VARIANTS:
        saved.clear()
        got = variant(vn, args, {})()
        errs[vn] = [round((a.float() - b.float()).abs().max().item(), 5) for a, b in zip(got, ref)]
    row = {"run": "kv in registers, odd shapes", "cell": f"B{B} H{H}/{Hk} Nq{Nq} Nk{Nk} D{D} causal={causal} {dt}",
           "max_err_vs_deterministic": errs, **prov}
    rows.append(row)
    print(row["cell"], errs, flush=True)
saved.clear()

CELLS = [("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, False, torch.float16),
         ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, True, torch.float16),
         ("GQA32/8 D64 causal bf16 B4 N4096", 4, 32, 8, 4096, True, torch.bfloat16),
         ("MHA D64 full bf16 B4 H32 N4096", 4, 32, 32, 4096, False, torch.bfloat16)]
for rnd, (name, B, H, Hk, N, causal, dt) in enumerate(CELLS + CELLS):
    D = 64
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v, dout = mk(H), mk(Hk), mk(Hk), mk(H)
    scale = D ** -0.5
    out, lse = launch.attention_fwd(q, k, v, causal, scale, None)
    args = (dout, None, q, k, v, out, lse, causal, scale, None)
    qc, kc, vc = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal, enable_gqa=True)
    fns = {"cudnn": lambda: torch.autograd.grad(oc, (qc, kc, vc), dout, retain_graph=True)}
    for vn in VARIANTS:
        fns[vn] = variant(vn, args, {})
    got = {vn: fns[vn]() for vn in VARIANTS}
    same_dkdv = all(torch.equal(a, b) for a, b in zip(got["now"][1:], got["kvregs"][1:]))
    dq_diff = (got["now"][0].float() - got["kvregs"][0].float()).abs().max().item()
    times = interleaved_times(fns, rounds=5, round_ms=60)
    saved.clear()
    flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    row = {"run": "kv in registers, pass " + str(rnd // len(CELLS) + 1) + " of 2", "cell": name, "tflops": {kk: round(x, 1) for kk, x in res.items()},
           "vs_cudnn": {kk: round(x / res["cudnn"], 3) for kk, x in res.items()},
           "kvregs_vs_now": round(res["kvregs"] / res["now"], 3), "dk_dv_equal": same_dkdv, "dq_max_diff": dq_diff, **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {x:.0f} ({x / res['cudnn']:.3f}x)" for kk, x in res.items()),
          f"kvregs/now {res['kvregs'] / res['now']:.3f}", "dk dv equal", same_dkdv, f"dq diff {dq_diff:.2e}", flush=True)
with open(os.path.join(OUT, "bwd_kv_regs.jsonl"), "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
