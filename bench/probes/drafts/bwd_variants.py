"""The Hopper backward's step variants (hopper.BWD_VARIANT, BWD_DQ_BUFS) beside cuDNN, one process, interleaved
medians; each call forgets the launch plans so that the variant's constexprs are read again. maxdiff: against
the deterministic backward's gradients (the base variant's own diff is the yardstick)."""
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
VARIANTS = {"base": (dict(OVERLAP=0, DK_RS=False, DS_BUFS=2), {}),
            "rs": (dict(OVERLAP=0, DK_RS=True, DS_BUFS=2), {}),
            "dq2": (dict(OVERLAP=0, DK_RS=False, DS_BUFS=1), {128: 2}),
            "rs_dq2": (dict(OVERLAP=0, DK_RS=True, DS_BUFS=1), {128: 2})}
for name, B, H, Hk, N, D, causal, dt in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_()
    dout = mk(H)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    od = diyflash.flash_attention(q, k, v, causal=causal, deterministic=False)
    odet = diyflash.flash_attention(q, k, v, causal=causal, deterministic=True)
    ref = torch.autograd.grad(odet, (q, k, v), dout, retain_graph=True)
    def variant(var, bufs):
        def run():
            hopper.BWD_VARIANT.update(var)
            hopper.BWD_DQ_BUFS.clear()
            hopper.BWD_DQ_BUFS.update(bufs)
            launch.PLANS.clear()
            return torch.autograd.grad(od, (q, k, v), dout, retain_graph=True)
        return run
    fns = {"cudnn": lambda: torch.autograd.grad(oc, (q, k, v), dout, retain_graph=True)}
    for vn, (var, bufs) in VARIANTS.items():
        if D == 64 and vn.endswith("dq2"):
            continue
        fns[vn] = variant(var, bufs)
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
