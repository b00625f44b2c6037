"""Packed sequences on the Hopper backward: plain stats loads (VARLEN) against the TMA (dense / seq_lens) at the
same work (equal lengths), and the deterministic portable kernels; one process, interleaved medians."""
import json, os
import torch
import diyflash
from diyflash.kernels.attention import hopper
from bench.common import interleaved_times, quantiles, provenance

hopper.use("hopper")
OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
for n_docs, L, H, Hk, D, dt in ((8, 2048, 32, 8, 128, torch.bfloat16), (16, 1024, 16, 16, 64, torch.bfloat16),
                                (4, 4096, 32, 8, 128, torch.bfloat16)):
    T = n_docs * L
    cu = torch.arange(0, T + 1, L, dtype=torch.int32, device="cuda")
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=dt)
    q, k, v = mk(T, H, D).requires_grad_(), mk(T, Hk, D).requires_grad_(), mk(T, Hk, D).requires_grad_()
    dout = mk(T, H, D)
    # the same numbers as (B, H, N, D) views of (B, N, H, D) buffers
    qb, kb, vb = (x.detach().view(n_docs, L, -1, D).transpose(1, 2).requires_grad_() for x in (q, k, v))
    doutb = dout.view(n_docs, L, H, D).transpose(1, 2)
    lens = torch.full((n_docs,), L, dtype=torch.int32, device="cuda")
    outs = {
        "packed hopper": (diyflash.flash_attention_varlen(q, k, v, cu, cu, L, L, True, deterministic=False), (q, k, v), dout),
        "packed det": (diyflash.flash_attention_varlen(q, k, v, cu, cu, L, L, True, deterministic=True), (q, k, v), dout),
        "dense hopper": (diyflash.flash_attention(qb, kb, vb, causal=True, deterministic=False), (qb, kb, vb), doutb),
        "seq_lens hopper": (diyflash.flash_attention(qb, kb, vb, causal=True, seq_lens=lens, deterministic=False), (qb, kb, vb), doutb),
    }
    fns = {name: (lambda o=o, i=i, g=g: torch.autograd.grad(o, i, g, retain_graph=True)) for name, (o, i, g) in outs.items()}
    ref = fns["packed det"]()
    errs = {}
    for name, f in fns.items():
        got = f()
        errs[name] = max((a.float() - b.float().reshape(a.shape) if a.shape == b.shape else
                          a.float().transpose(1, 2).reshape(b.shape) - b.float()).abs().max().item() for a, b in zip(got, ref))
    times = interleaved_times(fns, rounds=5, round_ms=50)
    flops = 2.5 * 4 * H * D * L * L / 2 * n_docs
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    cell = f"{n_docs} x {L} GQA{H}/{Hk} D{D} bf16 causal"
    print(cell + ": " + "  ".join(f"{kk} {x:.0f}" for kk, x in res.items())
          + f"  packed/dense {res['packed hopper'] / res['dense hopper']:.3f}x  errs {errs}", flush=True)
    rows.append(dict(prov, cell=cell, tflops=res, maxdiff=errs))
    del q, k, v, dout, fns, outs, qb, kb, vb
json.dump(rows, open(os.path.join(OUT, "packed_ab.json"), "w"), indent=1, default=str)
