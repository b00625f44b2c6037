"""PYTHONPATH=$PWD python bench/probes/drafts/fwd_own_band.py: the Hopper forward with each consumer walking its own rows' band of key blocks ("own": hopper.FWD_OWN_BAND)
against the tile's band ("now"), and "now" again (an A/A check of the order), each variant on its own plans
(launch.attention_fwd), every variant timed right after cuDNN (a provider timed after a slower, cooler one meets
higher clocks: a first run in the order cudnn, fa2, now, own had "now" 4-19 % above "own" on D128 cells where the
two run the same blocks); the variants' order reversed every round; 6 rounds of 40 ms each (do_bench)."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton
from bench.common import quantiles, attention_flops, provenance
from diyflash.kernels.attention import hopper, launch

OUT = os.environ.get("OUT", "/tmp")
CELLS = [
    ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16),
    ("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16),
    ("MHA D64 causal bf16 B4 H32 N4096", 4, 32, 32, 4096, 64, True, torch.bfloat16),
    ("GQA32/8 D64 causal bf16 B1 N16384", 1, 32, 8, 16384, 64, True, torch.bfloat16),
    ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16),
    ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16),
    ("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16),
    ("MHA D128 causal fp16 Nq4000 Nk4500 B4 H16", 4, 16, 16, (4000, 4500), 128, True, torch.float16),
]
prov = provenance()
rows = []
saved = {}


def variant(var, q, k, v, causal, scale):
    def run():
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        hopper.FWD_OWN_BAND = var == "own"
        got = launch.attention_fwd(q, k, v, causal, scale, None)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


for name, B, H, Hk, N, D, causal, dtype in CELLS:
    nq, nk = N if isinstance(N, tuple) else (N, N)
    saved.clear()
    q = torch.randn(B, H, nq, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, Hk, nk, D, device="cuda", dtype=dtype) for _ in range(2))
    scale = D ** -0.5

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hk)
    fns = {"now": variant("now", q, k, v, causal, scale), "own": variant("own", q, k, v, causal, scale)}
    fns["now2"] = fns["now"]
    same = all(torch.equal(a, b) for a, b in zip(fns["now"](), fns["own"]()))
    cudnn()
    torch.cuda.synchronize()
    times = {n: [] for n in ("cudnn", "now", "own", "now2")}
    for r in range(6):
        order = ["now", "own", "now2"] if r % 2 == 0 else ["now2", "own", "now"]
        for var in order:
            times["cudnn"] += triton.testing.do_bench(cudnn, warmup=25, rep=40, return_mode="all")
            times[var] += triton.testing.do_bench(fns[var], warmup=25, rep=40, return_mode="all")
    if nq == nk:
        flops = attention_flops(B, H, nq, nk, D, causal, "fwd")
    else:  # bottom-right causal: row i sees i + nk - nq + 1 keys
        flops = 4 * B * H * D * sum(i + nk - nq + 1 for i in range(nq))
    tf = {n: flops / quantiles(t, (0.5,))[0] / 1e9 for n, t in times.items()}
    rows.append(dict(prov, run="own band", cell=name, tflops=tf, own_bitwise_equal=same))
    print(f"{name}: " + " ".join(f"{n} {v:.0f} ({v / tf['cudnn']:.3f}x)" for n, v in tf.items())
          + f" | own/now {tf['own'] / tf['now']:.3f} now2/now {tf['now2'] / tf['now']:.3f} | bitwise {same}", flush=True)
hopper.FWD_OWN_BAND = True
json.dump(rows, open(os.path.join(OUT, "own_band.json"), "w"), indent=1, default=str)
