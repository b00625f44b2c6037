"""Probe: the Hopper backward with seq_lens (GQA 32/8 causal B4 N4096, D128 bf16 and D64 fp16) against the
deterministic portable kernels, one process, interleaved medians."""
import json, os, torch, diyflash
from bench.common import interleaved_times, quantiles, provenance
prov = provenance(); rows = []
for D, dt in ((128, torch.bfloat16), (64, torch.float16)):
    B, H, Hk, N = 4, 32, 8, 4096
    lens = torch.tensor([4096, 3000, 2048, 3500], dtype=torch.int32, device="cuda")
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_(); dout = mk(H)
    fns = {}
    for label, det in (("hopper", False), ("portable det", True)):
        o = diyflash.flash_attention(q, k, v, causal=True, seq_lens=lens, deterministic=det)
        fns[label] = (lambda o=o: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    a = fns["hopper"](); b = fns["portable det"]()
    err = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
    t = interleaved_times(fns, rounds=5, round_ms=50)
    flops = sum(2.5 * 4 * H * D * l * l / 2 for l in lens.tolist())
    res = {kk: flops / quantiles(x, (0.5,))[0] / 1e9 for kk, x in t.items()}
    print(f"seq_lens GQA32/8 D{D} causal B4 N4096 lens {lens.tolist()}: " + " ".join(f"{kk} {x:.0f}" for kk, x in res.items()) + f" ratio {res['hopper'] / res['portable det']:.2f}x maxdiff {err:.3g}", flush=True)
    rows.append(dict(prov, cell=f"seq_lens GQA32/8 D{D} causal B4 N4096", lens=lens.tolist(), tflops=res, maxdiff=err))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "seqlens.json"), "w"), indent=1, default=str)
