"""PYTHONPATH=$PWD python bench/probes/drafts/cells_after_cudnn.py: Issues 46/48's cells, every provider timed right after cuDNN (the anchor; a provider timed after a slower one
meets higher clocks), the others' order reversed every round, 6 rounds of 40 ms: forward (FA2 through SDPA,
Flex on the window, diyflash) and backward (FA2, Flex on the window, diyflash default and deterministic=True),
through the API. TFLOPS: forward 4BHN^2D (halved causal), backward 2.5x."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton
import diyflash
from bench.common import quantiles, attention_flops, compiled_flex, provenance

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
prov = provenance()
print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']}", flush=True)
rows = []


def sdpa(be, *args, **kw):
    def run():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(*args, **kw)
    return run


for name, B, H, Hk, N, D, causal, dtype, window in CELLS:
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dtype, generator=g)
    q, k, v, dout = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_(), mk(H)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    gqa = H != Hk
    grad = lambda o: (lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    fwd = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, qd, kd, vd, is_causal=causal, enable_gqa=gqa)}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        bwd = {"cudnn": grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa))}
    if window == (-1, -1):
        fwd["fa2"] = sdpa(SDPBackend.FLASH_ATTENTION, qd, kd, vd, is_causal=causal, enable_gqa=gqa)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            bwd["fa2"] = grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa))
    else:
        from torch.nn.attention.flex_attention import create_block_mask
        flex, w = compiled_flex(), window[0]
        bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, N, N, device="cuda")
        fwd["flex"] = lambda: flex(qd, kd, vd, block_mask=bm, enable_gqa=True)
        bwd["flex"] = grad(flex(q, k, v, block_mask=bm, enable_gqa=True))
    fwd["diyflash"] = lambda: diyflash.flash_attention(qd, kd, vd, causal=causal, window_size=window)
    bwd["diyflash"] = grad(diyflash.flash_attention(q, k, v, causal=causal, window_size=window, deterministic=False))
    bwd["det"] = grad(diyflash.flash_attention(q, k, v, causal=causal, window_size=window, deterministic=True))
    for fn in list(fwd.values()) + list(bwd.values()):
        fn()
    torch.cuda.synchronize()
    res = {}
    for mode, fns in (("fwd", fwd), ("bwd", bwd)):
        times = {n: [] for n in fns}
        others = [n for n in fns if n != "cudnn"]
        for r in range(6):
            for n in (others if r % 2 == 0 else others[::-1]):
                times["cudnn"] += triton.testing.do_bench(fns["cudnn"], warmup=25, rep=40, return_mode="all")
                times[n] += triton.testing.do_bench(fns[n], warmup=25, rep=40, return_mode="all")
        flops = attention_flops(B, H, N, N, D, causal, mode)
        if window != (-1, -1):
            w = window[0]
            flops = (2.5 if mode == "bwd" else 1.0) * 4 * B * H * D * (N * (w + 1) - w * (w + 1) / 2)
        res[mode] = {n: flops / quantiles(t, (0.5,))[0] / 1e9 for n, t in times.items()}
    line = []
    for mode in ("fwd", "bwd"):
        base = res[mode]["flex"] if window != (-1, -1) else res[mode]["cudnn"]
        line.append(f"{mode}: " + " ".join(f"{n} {tf:.0f} ({tf / base:.3f}x)" for n, tf in res[mode].items()
                                          if window == (-1, -1) or n != "cudnn"))
    print(f"{name} | " + " | ".join(line), flush=True)
    rows.append(dict(prov, run="cells after cuDNN", cell=name, fwd_tflops=res["fwd"], bwd_tflops=res["bwd"]))
    del q, k, v, dout, fwd, bwd
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "cells_ctl.json"), "w"), indent=1, default=str)
