"""(issue 48) Gluon or Triton's own warp specialization: which gets where on the headline cells.

The Hopper kernels are Gluon (explicit partitions, mbarriers, wgmma); Triton's automatic warp specialization
(`tl.range(..., warp_specialize=True)`) is the portable kernels' `ws` tile flag (attention_configs.AttnConfig:
8 warps, TMA loads), a candidate of every tuning sweep. This times, beside cuDNN through SDPA and each right
after it (bench.attention.measure_cell): diyflash as a user calls it (the Gluon kernels), the portable kernels
on their tuned tiles, and on warp-specialized tiles (the forward's WS_FWD per head dim; the backward,
deterministic two-kernel, with dk/dv and dq on WS_BWD). The portable runs go through the launchers with a
config, so no Hopper kernel is taken.

    python bench/probes/drafts/triton_ws/probe.py --warm CELL     (compile one cell's kernels, no timing)
    python bench/probes/drafts/triton_ws/probe.py --run LABEL --out F.jsonl [--cells ...]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import torch

from bench.attention import inputs, measure_cell, sdpa
from bench.cells import CELLS, cell_flops
from bench.common import DTYPES, provenance
from bench.plots import write_jsonl
from diyflash.kernels.attention import launch as ka
from diyflash.kernels.attention import launch_bwd as kb
from diyflash.kernels.attention_configs import AttnConfig, BwdConfig, bwd_config, fwd_config

FWD_CELLS = ["GQA32/8 D128 causal bf16 B4 N4096", "GQA32/8 D128 causal bf16 B1 N16384",
             "MHA D64 full fp16 B2 H16 N8192", "MHA D64 causal fp16 B2 H16 N8192",
             "MHA D128 full fp16 B2 H16 N8192", "MHA D128 causal fp16 B2 H16 N8192"]
BWD_CELLS = ["GQA32/8 D128 causal bf16 B1 N16384", "MHA D128 full fp16 B2 H16 N8192",
             "MHA D128 causal fp16 B2 H16 N8192"]
# the sweeps' best warp-specialized forward tiles (bench/results/attention_configs_h200.jsonl) and one more each
WS_FWD = {128: [AttnConfig(128, 128, 8, 3, tma=True, ws=True), AttnConfig(128, 64, 8, 2, tma=True, ws=True)],
          64: [AttnConfig(128, 64, 8, 3, tma=True, ws=True), AttnConfig(128, 128, 8, 2, tma=True, ws=True)]}
# the sweeps' best warp-specialized backward tiles at D128 N8192 (dk/dv 64x128 w8, dq 128x64 w8)
WS_BWD = BwdConfig(AttnConfig(64, 128, 8, 4, tma=True, ws=True), AttnConfig(128, 64, 8, 4, tma=True, ws=True))


class _Portable(torch.autograd.Function):
    """The portable kernels on given tiles: forward with fcfg, deterministic backward with bcfg."""

    @staticmethod
    def forward(ctx, q, k, v, causal, fcfg, bcfg):
        scale = q.shape[-1] ** -0.5
        out, lse = ka.attention_fwd(q, k, v, causal, scale, None, config=fcfg)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.bcfg = causal, scale, bcfg
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = kb.attention_bwd(dout, None, q, k, v, out, lse, ctx.causal, ctx.scale, None, config=ctx.bcfg,
                                      deterministic=True)
        return dq, dk, dv, None, None, None


def providers(name: str, mode: str) -> dict:
    import diyflash
    from torch.nn.attention import SDPBackend

    b, h, h_kv, n, d, causal, dname, _ = CELLS[name]
    dtype = DTYPES[dname]
    dev = torch.device("cuda")
    tuned_f, tuned_b = fwd_config(d, dtype, dev, causal, False, n), bwd_config(d, dtype, dev, causal, False, n)
    found = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
             "gluon": lambda q, k, v, c: diyflash.flash_attention(q, k, v, causal=c),
             "portable": lambda q, k, v, c: _Portable.apply(q, k, v, c, tuned_f, tuned_b)}
    if mode == "fwd":
        for cfg in WS_FWD[d]:
            found[f"ws{cfg.block_m}x{cfg.block_n}s{cfg.num_stages}"] = (
                lambda q, k, v, c, cfg=cfg: _Portable.apply(q, k, v, c, cfg, tuned_b))
    else:
        found["ws"] = lambda q, k, v, c: _Portable.apply(q, k, v, c, tuned_f, WS_BWD)
    return found, {"portable_fwd": str(tuned_f), "portable_bwd": str(tuned_b)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--warm", default=None)
    p.add_argument("--run", default="gluon or triton ws")
    p.add_argument("--out", default=None)
    p.add_argument("--modes", nargs="+", default=["fwd", "bwd"])
    args = p.parse_args(argv)
    prov = provenance()
    rows = []
    for mode in args.modes:
        for name in (FWD_CELLS if mode == "fwd" else BWD_CELLS):
            if args.warm is not None and name != args.warm:
                continue
            b, h, h_kv, n, d, causal, dname, _ = CELLS[name]
            q, k, v = inputs(b, h, h_kv, n, d, DTYPES[dname], "bhnd")
            found, tiles = providers(name, mode)
            if args.warm is not None:  # compile every provider's kernels (and check them against cuDNN)
                ref = found["cudnn"](q, k, v, causal).float()
                for prov_name, fn in found.items():
                    err = (fn(q, k, v, causal).float() - ref).abs().max().item()
                    print(f"warm {name} {mode} {prov_name}: max |out - cudnn| {err:.2e}", flush=True)
                    if mode == "bwd":
                        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                        torch.autograd.grad(fn(qg, kg, vg, causal), (qg, kg, vg), torch.randn_like(q))
                torch.cuda.synchronize()
                continue
            times = measure_cell(found, q, k, v, causal, mode, anchor="cudnn")
            tf = {pn: cell_flops(name, mode) / t[0] / 1e9 for pn, t in times.items()}
            for pn, x in tf.items():
                rows.append(dict(prov, run=args.run, cell=name, mode=mode, provider=pn, tflops=x,
                                 vs_peer=x / tf["cudnn"], peer="cudnn", **tiles))
            print(f"| {name} | {mode} | " + " | ".join(f"{pn} {x:.0f} ({x / tf['cudnn']:.3f}x)" for pn, x in tf.items())
                  + " |", flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    if args.out and rows:
        write_jsonl(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
