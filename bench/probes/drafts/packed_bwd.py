"""Packed sequences' backward (Hopper one-pass vs the deterministic portable kernels) and a dense regression
cell against cuDNN, one process, interleaved medians."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
g = torch.Generator(device="cpu").manual_seed(0)
for name, lens, H, Hk, D in (("packed 8 docs, 16k tokens, GQA32/8 D128 bf16 causal", None, 32, 8, 128),
                             ("packed 16 docs, 16k tokens, MHA16 D64 bf16 causal", None, 16, 16, 64)):
    n = 8 if D == 128 else 16
    w = torch.rand(n, generator=g) + 0.3
    lens = [int(x) for x in (w / w.sum() * 16384).round().tolist()]
    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    mk = lambda h: torch.randn(T, h, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_()
    dout = mk(H)
    fns = {}
    for label, det in (("hopper", False), ("portable det", True)):
        o = diyflash.flash_attention_varlen(q, k, v, cu, cu, max(lens), max(lens), True, deterministic=det)
        fns[label] = (lambda o=o: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    a = fns["hopper"](); b = fns["portable det"]()
    err = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
    times = interleaved_times(fns, rounds=5, round_ms=50)
    flops = sum(2.5 * 4 * H * D * l * l / 2 for l in lens)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    print(f"{name} lens {lens}: " + "  ".join(f"{kk} {x:.0f}" for kk, x in res.items())
          + f"  ratio {res['hopper'] / res['portable det']:.2f}x  maxdiff {err:.3g}", flush=True)
    rows.append(dict(prov, cell=name, lens=lens, tflops=res, maxdiff=err))
    del q, k, v, dout, fns
B, H, Hk, N, D = 4, 32, 8, 4096, 128
mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16)
q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_()
dout = mk(H)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    oc = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
od = diyflash.flash_attention(q, k, v, causal=True, deterministic=False)
fns = {"cudnn": lambda: torch.autograd.grad(oc, (q, k, v), dout, retain_graph=True),
       "diyflash": lambda: torch.autograd.grad(od, (q, k, v), dout, retain_graph=True)}
for f in fns.values():
    f()
times = interleaved_times(fns, rounds=5, round_ms=50)
flops = 2.5 * 4 * B * H * N * N * D / 2
res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
print(f"dense GQA32/8 D128 causal bf16 B4 N4096: cudnn {res['cudnn']:.0f} diyflash {res['diyflash']:.0f} ({res['diyflash'] / res['cudnn']:.3f}x)")
rows.append(dict(prov, cell="GQA32/8 D128 causal bf16 B4 N4096", tflops=res))
json.dump(rows, open(os.path.join(OUT, "varlen_bench.json"), "w"), indent=1, default=str)
