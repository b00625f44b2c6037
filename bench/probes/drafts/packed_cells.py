"""Packed sequences' backward under "auto" (the Hopper kernel since the loader loads their stats) against the
deterministic portable kernels (what "auto" ran before), one process, interleaved medians."""
import json, os
import torch
import diyflash
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
g = torch.Generator(device="cpu").manual_seed(0)
CELLS = [("8 docs random, GQA32/8 D128 bf16", 8, None, 32, 8, 128, torch.bfloat16),
         ("16 docs random, MHA16 D64 bf16", 16, None, 16, 16, 64, torch.bfloat16),
         ("8 docs x 2048, GQA32/8 D128 bf16", 8, 2048, 32, 8, 128, torch.bfloat16),
         ("32 docs x 512, GQA32/8 D128 bf16", 32, 512, 32, 8, 128, torch.bfloat16),
         ("64 docs x 256, GQA32/8 D128 bf16", 64, 256, 32, 8, 128, torch.bfloat16),
         ("64 docs x 256, MHA16 D64 fp16", 64, 256, 16, 16, 64, torch.float16),
         ("128 docs x 128, MHA16 D64 fp16", 128, 128, 16, 16, 64, torch.float16)]
for name, n, L, H, Hk, D, dt in CELLS:
    if L is None:
        w = torch.rand(n, generator=g) + 0.3
        lens = [int(x) for x in (w / w.sum() * 16384).round().tolist()]
    else:
        lens = [L] * n
    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    mk = lambda h: torch.randn(T, h, D, device="cuda", dtype=dt)
    q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_()
    dout = mk(H)
    fns = {}
    for label, det in (("auto", False), ("det", True)):
        o = diyflash.flash_attention_varlen(q, k, v, cu, cu, max(lens), max(lens), True, deterministic=det)
        fns[label] = (lambda o=o: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    a = fns["auto"](); b = fns["det"]()
    err = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
    times = interleaved_times(fns, rounds=5, round_ms=50)
    flops = sum(2.5 * 4 * H * D * l * l / 2 for l in lens)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    print(f"{name} ({min(lens)}-{max(lens)}): auto {res['auto']:.0f} det {res['det']:.0f} ratio {res['auto'] / res['det']:.2f}x  maxdiff {err:.3g}", flush=True)
    rows.append(dict(prov, cell=name, lens=lens, tflops=res, maxdiff=err))
    del q, k, v, dout, fns
json.dump(rows, open(os.path.join(OUT, "packed_cells.json"), "w"), indent=1, default=str)
