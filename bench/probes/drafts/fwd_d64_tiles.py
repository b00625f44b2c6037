"""The Hopper forward at head_dim 64 with other tiles (hopper.TILES[64]: keys a block, slots, consumer
warpgroups) beside the portable kernel and cuDNN, one process, interleaved medians. Offline sm_90a builds
(Triton 3.6): Tiles(128, 3, 3) spills 288 B (fp16) / 660 B (bf16 causal), the others none."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
from diyflash.kernels.attention import hopper, launch
from diyflash.kernels.attention.hopper import Tiles
from diyflash.ops import attention_fast
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
CELLS = [("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, False, torch.float16),
         ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, True, torch.float16),
         ("GQA32/8 D64 causal bf16 B4 N4096", 4, 32, 8, 4096, True, torch.bfloat16),
         ("MHA D64 full fp16 B16 H16 N1024", 16, 16, 16, 1024, False, torch.float16)]
PROVIDERS = {"portable": None, "t128x3x3": Tiles(128, 3, 3), "t64x4x3": Tiles(64, 4, 3), "t64x3x2": Tiles(64, 3, 2),
             "t128x2x2": Tiles(128, 2, 2)}
hopper.use("hopper")
stores = {p: ({}, {}) for p in PROVIDERS}
def runner(p, q, k, v, causal):
    tiles = PROVIDERS[p]
    plans, fast = stores[p]
    def run():
        hopper._backend = "portable" if tiles is None else "hopper"
        if tiles is not None:
            hopper.TILES[64] = tiles
        launch.PLANS.clear(); launch.PLANS.update(plans)
        attention_fast._FAST.clear(); attention_fast._FAST.update(fast)
        out = diyflash.flash_attention(q, k, v, causal=causal)
        plans.update(launch.PLANS); fast.update(attention_fast._FAST)
        return out
    return run
for name, B, H, Hk, N, causal, dt in CELLS:
    mk = lambda h: torch.randn(B, h, N, 64, device="cuda", dtype=dt)
    q, k, v = mk(H), mk(Hk), mk(Hk)
    for p in stores:
        stores[p] = ({}, {})
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    fns = {"cudnn": cudnn, **{p: runner(p, q, k, v, causal) for p in PROVIDERS}}
    outs = {p: fns[p]() for p in fns}
    diff = {p: round((outs[p].float() - outs["portable"].float()).abs().max().item(), 5) for p in fns}
    times = interleaved_times(fns, rounds=5, round_ms=60)
    flops = 4 * B * H * N * N * 64 * (0.5 if causal else 1.0)
    res = {p: flops / quantiles(t, (0.5,))[0] / 1e9 for p, t in times.items()}
    print(name + ": " + "  ".join(f"{p} {x:.0f} ({x / res['cudnn']:.3f}x)" for p, x in res.items()), flush=True)
    print("   maxdiff vs portable:", diff, flush=True)
    rows.append(dict(prov, cell=name, tflops=res, maxdiff_vs_portable=diff))
    del q, k, v, outs, fns
json.dump(rows, open(os.path.join(OUT, "fwd_d64.json"), "w"), indent=1, default=str)
