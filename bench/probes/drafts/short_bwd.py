"""The Hopper backward on calls whose programs walk few query steps (short sequences, MHA) against the
deterministic portable kernels (what runs otherwise at these lengths), dense and packed, one process."""
import json, os
import torch
import diyflash
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
CELLS = [("dense", 64, 16, 16, 256, 64, torch.float16), ("dense", 32, 16, 16, 512, 64, torch.float16),
         ("dense", 16, 16, 16, 1024, 64, torch.float16), ("dense", 64, 16, 16, 256, 128, torch.bfloat16),
         ("dense", 32, 16, 16, 512, 128, torch.bfloat16), ("dense", 16, 16, 16, 1024, 128, torch.bfloat16),
         ("dense", 32, 16, 4, 256, 128, torch.bfloat16), ("packed", 32, 16, 16, 512, 64, torch.float16),
         ("packed", 64, 16, 16, 256, 64, torch.float16)]
for kind, B, H, Hk, N, D, dt in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_()
    dout = mk(H)
    if kind == "packed":
        q, k, v, dout = (x.detach().transpose(1, 2).reshape(B * N, x.shape[1], D) for x in (q, k, v, dout))
        q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        cu = torch.arange(0, B * N + 1, N, dtype=torch.int32, device="cuda")
        call = lambda det: diyflash.flash_attention_varlen(q, k, v, cu, cu, N, N, True, deterministic=det)
    else:
        call = lambda det: diyflash.flash_attention(q, k, v, causal=True, deterministic=det)
    fns = {}
    for label, det in (("auto", False), ("det", True)):
        o = call(det)
        fns[label] = (lambda o=o: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    a = fns["auto"](); b = fns["det"]()
    err = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
    times = interleaved_times(fns, rounds=5, round_ms=50)
    flops = 2.5 * 4 * B * H * N * N * D / 2
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    steps = (H // Hk) * N // 64
    name = f"{kind} B{B} H{H}/{Hk} N{N} D{D} {str(dt)[6:]} causal (steps {steps})"
    print(f"{name}: auto {res['auto']:.0f} det {res['det']:.0f} ratio {res['auto'] / res['det']:.2f}x  maxdiff {err:.3g}", flush=True)
    rows.append(dict(prov, cell=name, tflops=res, maxdiff=err))
json.dump(rows, open(os.path.join(OUT, "short_bwd.json"), "w"), indent=1, default=str)
