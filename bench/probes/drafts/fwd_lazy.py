"""The Hopper forward with lazy rescaling (probe-only switch hopper.FWD_VARIANT["LAZY"]): the row max moves
only by more than LAZY_SLACK and a warp none of whose rows moved skips acc * alpha (lazy.py, as the portable
forward's LAZY), where the kernel rescales every block (ncu: one of its ~5.5 ALU instructions a score is that
multiply). Beside cuDNN, one process, in turns; each variant keeps its own plans (launch.PLANS swapped).
Errors against the float32 math reference. Run with fwd_lazy.patch applied: PYTHONPATH=$PWD python bench/probes/drafts/fwd_lazy.py"""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from diyflash.kernels.attention import hopper, launch
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
CELLS = [("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16, None),
         ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, None),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16, None),
         ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16, None),
         ("MHA D128 full bf16 B4 H16 N4096", 4, 16, 16, 4096, 128, False, torch.bfloat16, None),
         ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, (4096, 0))]
VARIANTS = {"base": False, "lazy": True}
saved = {}
for name, B, H, Hk, N, D, causal, dt, window in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H), mk(Hk), mk(Hk)
    scale = D ** -0.5
    kw = {} if window is None else {"window": window}

    def variant(var):
        def run():
            launch.PLANS.clear()
            launch.PLANS.update(saved.get(var, {}))
            hopper.FWD_VARIANT["LAZY"] = var
            got = launch.attention_fwd(q, k, v, causal, scale, None, **kw)
            if var not in saved:
                saved[var] = dict(launch.PLANS)
            return got
        return run
    fns = {vn: variant(var) for vn, var in VARIANTS.items()}
    if window is None:
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        fns["cudnn"] = cudnn
    errs = {}
    if N <= 8192 and window is None:
        qf, kf, vf = (x.float() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, enable_gqa=True)
        for kk, fn in fns.items():
            got = fn()
            got = got[0] if isinstance(got, tuple) else got
            errs[kk] = round((got.float() - ref).abs().max().item(), 6)
        del qf, kf, vf, ref
    else:
        outs = {kk: fns[kk]()[0] for kk in VARIANTS}
        errs["lazy_vs_base"] = round((outs["lazy"].float() - outs["base"].float()).abs().max().item(), 6)
    saved.clear()
    times = interleaved_times(fns, rounds=5, round_ms=60)
    flops = None if window is not None else 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    med = {kk: quantiles(t, (0.5,))[0] for kk, t in times.items()}
    peer = "cudnn" if "cudnn" in med else "base"
    row = {"run": "lazy rescale", "cell": name, "ms": {kk: round(x, 4) for kk, x in med.items()},
           "vs_peer": {kk: round(med[peer] / x, 3) for kk, x in med.items()}, "peer": peer,
           "tflops": {kk: round(flops / x / 1e9, 1) for kk, x in med.items()} if flops else None,
           "max_err": errs, **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {med[peer] / x:.3f}x" for kk, x in med.items()), row["tflops"], "| errs", errs, flush=True)
with open(os.path.join(OUT, "fwd_lazy.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
