"""The Hopper backward's wgmma issue order (probe-only switches: apply bwd_issue_order.patch first): dq issued
after dv alone (dk still running), the q/do slot released before dq, dq issued before dv and dk are waited on
(D64 only: ptxas serializes it at D128); beside cuDNN, one process, interleaved medians."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
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
VARIANTS = {"base": dict(DQ_EARLY=0, EMPTY_EARLY=False),
            "dq_after_dv": dict(DQ_EARLY=2, EMPTY_EARLY=False),
            "empty_early": dict(DQ_EARLY=0, EMPTY_EARLY=True),
            "dq_early": dict(DQ_EARLY=1, EMPTY_EARLY=False)}  # D64 only: C7512 at D128
for name, B, H, Hk, N, D, causal, dt in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_()
    dout = mk(H)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    od = diyflash.flash_attention(q, k, v, causal=causal, deterministic=False)
    odet = diyflash.flash_attention(q, k, v, causal=causal, deterministic=True)
    ref = torch.autograd.grad(odet, (q, k, v), dout, retain_graph=True)
    def variant(var):
        def run():
            hopper.BWD_VARIANT.update(var)
            launch.PLANS.clear()
            return torch.autograd.grad(od, (q, k, v), dout, retain_graph=True)
        return run
    fns = {"cudnn": lambda: torch.autograd.grad(oc, (q, k, v), dout, retain_graph=True)}
    for vn, var in VARIANTS.items():
        if D == 128 and vn == "dq_early":
            continue
        fns[vn] = variant(var)
    errs = {}
    for kk in fns:
        got = fns[kk]()
        errs[kk] = [round((a.float() - b.float()).abs().max().item(), 5) for a, b in zip(got, ref)]
    times = interleaved_times(fns, rounds=5, round_ms=60)
    flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    print(name + ": " + "  ".join(f"{kk} {x:.0f} ({x / res['cudnn']:.3f}x)" for kk, x in res.items()), flush=True)
    print("   maxdiff vs det (dq, dk, dv):", errs, flush=True)
    rows.append(dict(prov, cell=name, tflops=res, maxdiff=errs))
    del q, k, v, dout, oc, od, odet, ref, fns
json.dump(rows, open(os.path.join(OUT, "bwd_variants.json"), "w"), indent=1, default=str)
