"""Probe: diyflash's forward at chosen tiles against the seed's Triton tutorial at the same tiles.

    python -m bench.probes.tiles_probe --cells 64:1024:causal 128:2048:causal \\
        --tiles 64,64,4,3 64,64,4,3,rowoff 128,64,8,3      (H200 answer: bench/results/attention_tiles_probe_h200.txt)
    python -m bench.probes.tiles_probe --mode bwd --cells 64:16384:causal --tiles dkdv=64,64,4,3,rowoff dq=128,64,4,3,rowoff

For each cell (head_dim:N:plain|causal, fp16, B x H as bench.attention_configs sweeps them: 4x32 at
D64, 4x16 at D128, 2x8 otherwise) it times in turns: diyflash with its tuned tiles, diyflash at each
--tiles entry (block_m,block_n,warps,stages[,flag...], see AttnConfig), the tutorial as it autotunes itself, and
the tutorial forced to each --tiles entry that it can run (its own kernel, one config). TFLOPS,
medians. The tutorial's autotuner drops 8-warp configs below 128x128 tiles; forcing them shows what its
code does there. --mode bwd times the backward alone instead: each --tiles entry (KIND=tiles, KIND dkdv,
dv or dq) replaces that kernel's tuned tiles, and the tutorial's backward (causal cells only) runs as it
is. Needs a CUDA GPU and the seed (bench/tutorial.py).
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.common import attention_flops, interleaved_tflops


def parse_cell(spec: str) -> tuple[int, int, bool]:
    d, n, mode = spec.split(":")
    if mode not in ("plain", "causal"):
        raise ValueError(f"cell {spec!r}: expected HEAD_DIM:N:plain|causal")
    return int(d), int(n), mode == "causal"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", required=True, help="HEAD_DIM:N:plain|causal")
    parser.add_argument("--tiles", nargs="*", default=[], help="block_m,block_n,warps,stages[,flag...]")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--mode", choices=["fwd", "bwd"], default="fwd")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tiles_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    from bench.attention_configs import SHAPES
    from bench.probes.ncu_probe import parse_tiles
    from bench.tutorial import load_tutorial
    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import fwd_config, head_dim_pad

    if args.mode == "bwd":
        return _backward(args)
    tiles = [parse_tiles("fwd=" + t)[1] for t in args.tiles]
    torch.manual_seed(0)
    for d, n, causal in map(parse_cell, args.cells):
        b, h = SHAPES.get(head_dim_pad(d), (2, 8))
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        scale = d ** -0.5
        tuned = fwd_config(head_dim_pad(d), q.dtype, q.device, causal, False, n)
        fns = {"diyflash": lambda: ka.attention_fwd(q, k, v, causal, scale, None)}
        for cfg in tiles:
            fns["ours " + ",".join(map(str, cfg.as_tiles()))] = (
                lambda cfg=cfg: ka.attention_fwd(q, k, v, causal, scale, None, config=cfg))
        tut = load_tutorial()
        fns["tutorial"] = lambda: tut.attention(q, k, v, causal, scale)
        for cfg in tiles:
            if cfg.tma or cfg.block_n > d:  # the tutorial has no TMA path and asserts BLOCK_N <= HEAD_DIM
                continue
            forced = load_tutorial()  # a module of its own: its autotuner holds this one config
            forced._attn_fwd.configs = [triton.Config({"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n},
                                                      num_warps=cfg.num_warps, num_stages=cfg.num_stages)]
            fns[f"tutorial {cfg.block_m},{cfg.block_n},{cfg.num_warps},{cfg.num_stages}"] = (
                lambda forced=forced: forced.attention(q, k, v, causal, scale))
        ref = fns["diyflash"]()[0].float()
        for name, fn in fns.items():
            out = fn()
            out = out[0] if isinstance(out, tuple) else out
            err = (out.float() - ref).abs().max().item()
            if err > 1e-2:
                raise AssertionError(f"D{d} N{n} causal={causal}: {name} differs from diyflash by {err}")
        res = interleaved_tflops(fns, attention_flops(b, h, n, n, d, causal, "fwd"), args.rounds)
        print(f"D{d} N{n} {'causal' if causal else 'plain'} (tuned {','.join(map(str, tuned.as_tiles()))}; "
              f"tutorial picks {tut._attn_fwd.best_config.kwargs} w{tut._attn_fwd.best_config.num_warps} "
              f"s{tut._attn_fwd.best_config.num_stages}): "
              + "; ".join(f"{name} {t:.0f}" for name, t in res.items()), flush=True)
    return 0


def _backward(args) -> int:
    from bench.attention_configs import SHAPES
    from bench.probes.ncu_probe import parse_tiles, runner
    from diyflash.kernels.attention_configs import bwd_config, head_dim_pad

    for spec in args.tiles:
        parse_tiles(spec)  # a bad entry fails before anything runs
    torch.manual_seed(0)
    for d, n, causal in map(parse_cell, args.cells):
        b, h = SHAPES.get(head_dim_pad(d), (2, 8))
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        tuned = bwd_config(head_dim_pad(d), q.dtype, q.device, causal, False, n)
        specs = ["diyflash", *args.tiles] + (["tutorial"] if causal else [])
        fns = {}
        for spec in specs:
            torch.manual_seed(1)  # runner draws dout: the same one for every runner
            fns["ours " + spec if spec not in ("diyflash", "tutorial") else spec] = runner(spec, q, k, v, causal, "bwd")
        ref = fns["diyflash"]()
        for name, fn in fns.items():
            err = max((a.float() - r.float()).abs().max().item() for a, r in zip(fn(), ref))
            if err > 5e-2:
                raise AssertionError(f"D{d} N{n} causal={causal}: {name} differs from diyflash by {err}")
        res = interleaved_tflops(fns, attention_flops(b, h, n, n, d, causal, "bwd"), args.rounds)
        tiles = "; ".join(f"{kind} {','.join(map(str, cfg.as_tiles()))}"
                          for kind, cfg in (("dkdv", tuned.dkdv), ("dq", tuned.dq), ("dv", tuned.dv)) if cfg)
        print(f"bwd D{d} N{n} {'causal' if causal else 'plain'} (tuned {tiles}): "
              + "; ".join(f"{name} {t:.0f}" for name, t in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
