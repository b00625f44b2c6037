"""The Hopper forward's rescale order (probe-only switch: apply fwd_rescale_order.patch first; PROBE_LATE=1 makes
it the default for the tests): the block before's acc * alpha after q.k^T is issued, beside cuDNN; outputs bitwise."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
from diyflash.kernels.attention import hopper, launch
from diyflash.ops import attention_fast
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
CELLS = [("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16),
         ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16),
         ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16),
         ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16)]
VARIANTS = {"base": dict(RESCALE_LATE=False), "rescale_late": dict(RESCALE_LATE=True)}
for name, B, H, Hk, N, D, causal, dt in CELLS:
    win = (4095, 0) if name.startswith("window") else (-1, -1)
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H), mk(Hk), mk(Hk)
    def variant(var):
        def run():
            hopper.FWD_VARIANT.update(var)
            launch.PLANS.clear()
            attention_fast._FAST.clear()
            return diyflash.flash_attention(q, k, v, causal=causal, window_size=win)
        return run
    fns = {}
    if win == (-1, -1):
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        fns["cudnn"] = cudnn
    for vn, var in VARIANTS.items():
        fns[vn] = variant(var)
    outs = {kk: fns[kk]() for kk in fns}
    same = torch.equal(outs["base"], outs["rescale_late"])
    times = interleaved_times(fns, rounds=5, round_ms=60)
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    if win != (-1, -1):
        flops = 4 * B * H * N * 4096 * D  # ~ keys in the window a row
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    ref = res.get("cudnn", res["base"])
    print(name + ": " + "  ".join(f"{kk} {x:.0f} ({x / ref:.3f}x)" for kk, x in res.items()) + f"  bitwise equal: {same}",
          flush=True)
    rows.append(dict(prov, cell=name, tflops=res, bitwise_equal=same))
    del q, k, v, outs, fns
json.dump(rows, open(os.path.join(OUT, "fwd_variants.json"), "w"), indent=1, default=str)
