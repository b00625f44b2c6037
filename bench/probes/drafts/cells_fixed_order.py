"""PYTHONPATH=$PWD python bench/probes/drafts/cells_fixed_order.py (on fcbd31d, which has hopper.FWD_OWN_BAND): Issues 46/48's cells in one process, two passes: forward (cuDNN, FA2 through SDPA, Flex on the window; the Hopper
forward with each consumer walking the tile's band ("now") and its own rows' band ("own": hopper.FWD_OWN_BAND),
each variant on its own plans, launch.attention_fwd) and backward (cuDNN, FA2, Flex on the window; diyflash
default and deterministic=True through the API). TFLOPS: forward 4BHN^2D (halved causal), backward 2.5x;
medians of interleaved turns (5 rounds of 40 ms)."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
from bench.common import interleaved_times, quantiles, attention_flops, compiled_flex, provenance
from diyflash.kernels.attention import hopper, launch

OUT = os.environ.get("OUT", "/tmp")
CELLS = [
    ("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16, (-1, -1)),
    ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, (-1, -1)),
    ("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16, (-1, -1)),
    ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16, (-1, -1)),
    ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16, (-1, -1)),
    ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16, (-1, -1)),
    ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, (4096, 0)),
    ("MHA D64 causal bf16 B4 H32 N4096", 4, 32, 32, 4096, 64, True, torch.bfloat16, (-1, -1)),
]
prov = provenance()
print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']}", flush=True)
rows = []
saved = {}


def fwd_variant(var, q, k, v, causal, scale, window):
    def run():
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        hopper.FWD_OWN_BAND = var == "own"
        got = launch.attention_fwd(q, k, v, causal, scale, None, window=window)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


def sdpa_fwd(be, q, k, v, causal, gqa):
    def run():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return run


for rnd in range(2):
    for name, B, H, Hk, N, D, causal, dtype, window in CELLS:
        saved.clear()
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dtype, generator=g)
        q, k, v, dout = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_(), mk(H)
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        scale = D ** -0.5
        fwd, bwd = {}, {}
        grad = lambda o: (lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
        if window == (-1, -1):
            for pname, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                with sdpa_kernel(be):
                    fwd[pname] = sdpa_fwd(be, qd, kd, vd, causal, H != Hk)
                    bwd[pname] = grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hk))
        else:
            from torch.nn.attention.flex_attention import create_block_mask
            flex, w = compiled_flex(), window[0]
            bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, N, N, device="cuda")
            fwd["flex"] = lambda: flex(qd, kd, vd, block_mask=bm, enable_gqa=True)
            bwd["flex"] = grad(flex(q, k, v, block_mask=bm, enable_gqa=True))
        for var in ("now", "own"):
            fwd[var] = fwd_variant(var, qd, kd, vd, causal, scale, window)
        same = all(torch.equal(a, b) for a, b in zip(fwd["now"](), fwd["own"]()))
        bwd["diyflash"] = grad(diyflash.flash_attention(q, k, v, causal=causal, window_size=window, deterministic=False))
        bwd["det"] = grad(diyflash.flash_attention(q, k, v, causal=causal, window_size=window, deterministic=True))
        for fn in list(fwd.values()) + list(bwd.values()):
            fn()
        torch.cuda.synchronize()
        res = {}
        for mode, fns in (("fwd", fwd), ("bwd", bwd)):
            times = interleaved_times(fns, rounds=5, round_ms=40)
            flops = attention_flops(B, H, N, N, D, causal, mode)
            if window != (-1, -1):
                w = window[0]
                flops = (2.5 if mode == "bwd" else 1.0) * 4 * B * H * D * (N * (w + 1) - w * (w + 1) / 2)
            res[mode] = {n: flops / quantiles(t, (0.5,))[0] / 1e9 for n, t in times.items()}
        line = []
        for mode in ("fwd", "bwd"):
            base = res[mode].get("cudnn", res[mode].get("flex"))
            line.append(f"{mode}: " + " ".join(f"{n} {tf:.0f} ({tf / base:.3f}x)" for n, tf in res[mode].items()))
        print(f"[{rnd + 1}] {name} | " + " | ".join(line) + f" | own==now {same}", flush=True)
        rows.append(dict(prov, run=f"cells, pass {rnd + 1} of 2", cell=name, fwd_tflops=res["fwd"],
                         bwd_tflops=res["bwd"], own_bitwise_equal=same))
        del q, k, v, dout, fwd, bwd
        torch.cuda.empty_cache()
hopper.FWD_OWN_BAND = True
json.dump(rows, open(os.path.join(OUT, "cells.json"), "w"), indent=1, default=str)
