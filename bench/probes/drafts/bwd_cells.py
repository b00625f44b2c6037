"""Backward cells of issue 46 in one process: cuDNN, FA2 (SDPA flash), Flex (window), diyflash default
(deterministic=False) and deterministic=True; TFLOPS = 2.5x the forward's FLOPs; medians of interleaved turns."""
import json, os, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton
import diyflash
from bench.common import interleaved_times, quantiles, attention_flops, compiled_flex, provenance

OUT = os.environ.get("OUT", "/tmp")
CELLS = [
    ("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16, (-1, -1)),
    ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, (-1, -1)),
    ("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16, (-1, -1)),
    ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16, (-1, -1)),
    ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16, (-1, -1)),
    ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16, (-1, -1)),
    ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, (4096, 0)),
]
rows = []
prov = provenance()
print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']}", flush=True)
for name, B, H, Hk, N, D, causal, dtype, window in CELLS:
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dtype, generator=g)
    q, k, v, dout = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_(), mk(H)
    fns = {}
    grad = lambda o: (lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    if window == (-1, -1):
        for pname, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(be):
                fns[pname] = grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hk))
    else:
        from torch.nn.attention.flex_attention import create_block_mask
        flex, w = compiled_flex(), window[0]
        bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, N, N, device="cuda")
        fns["flex"] = grad(flex(q, k, v, block_mask=bm, enable_gqa=True))
    fns["diyflash"] = grad(diyflash.flash_attention(q, k, v, causal=causal, window_size=window, deterministic=False))
    fns["diyflash-det"] = grad(diyflash.flash_attention(q, k, v, causal=causal, window_size=window, deterministic=True))
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = interleaved_times(fns, rounds=5, round_ms=50)
    flops = attention_flops(B, H, N, N, D, causal, "bwd")
    if window != (-1, -1):
        w = window[0]
        flops = 2.5 * 4 * B * H * D * (N * (w + 1) - w * (w + 1) / 2)
    res = {n: flops / quantiles(t, (0.5,))[0] / 1e9 for n, t in times.items()}
    base = res.get("cudnn", res.get("flex"))
    print(f"{name}: " + "  ".join(f"{n} {tf:.0f} ({tf / base:.2f}x)" for n, tf in res.items()), flush=True)
    # the default's run-to-run spread of dq (not asserted anywhere)
    a = fns["diyflash"]()[0].float(); b = fns["diyflash"]()[0].float()
    spread = (a - b).abs().max().item()
    rows.append(dict(prov, run="hopper backward", cell=name, tflops=res, dq_spread=spread))
    del q, k, v, dout, fns
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "bwd_bench.json"), "w"), indent=1, default=str)
print("TABLE")
for r in rows:
    t = r["tflops"]; base = t.get("cudnn", t.get("flex"))
    print(f"| {r['cell']} | " + ", ".join(f"{n} {v:.0f} ({v / base:.2f}x)" for n, v in t.items()) + f" | dq spread {r['dq_spread']:.2g} |")
