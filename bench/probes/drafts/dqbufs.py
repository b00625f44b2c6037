"""The Hopper backward at head_dim 64 with one or two dq tile buffers (DQ_BUFS), beside cuDNN, one process,
interleaved medians (each call forgets the launch plans so that the variant's tiles are read again)."""
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
CELLS = [("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16),
         ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16),
         ("GQA32/8 D64 causal bf16 B4 N4096", 4, 32, 8, 4096, 64, True, torch.bfloat16),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16)]
for name, B, H, Hk, N, D, causal, dt in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_()
    dout = mk(H)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    od = diyflash.flash_attention(q, k, v, causal=causal, deterministic=False)
    def variant(bufs):
        def run():
            hopper.BWD_TILES[D] = hopper.BWD_TILES[D][:2] + (bufs,)
            launch.PLANS.clear()
            return torch.autograd.grad(od, (q, k, v), dout, retain_graph=True)
        return run
    fns = {"cudnn": lambda: torch.autograd.grad(oc, (q, k, v), dout, retain_graph=True),
           "dq1": variant(1)}
    if D == 64:
        fns["dq2"] = variant(2)
    ref = fns["dq1"]()
    errs = {}
    for kk in fns:
        got = fns[kk]()
        errs[kk] = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref))
    times = interleaved_times(fns, rounds=5, round_ms=50)
    flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    print(name + ": " + "  ".join(f"{kk} {x:.0f} ({x / res['cudnn']:.3f}x)" for kk, x in res.items()) + f"  errs {errs}", flush=True)
    rows.append(dict(prov, cell=name, tflops=res, maxdiff=errs))
    del q, k, v, dout, oc, od, fns
json.dump(rows, open(os.path.join(OUT, "dqbufs.json"), "w"), indent=1, default=str)
