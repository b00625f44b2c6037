"""One call of each kernel under test, for Nsight Compute's hardware counters.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \\
        python -m bench.ncu --shape 4x16x128 --n 1024 [--kv-heads 4] [--causal] [--mode fwd|bwd] \\
                                  --run diyflash tutorial fwd=64,64,4,3 dkdv=32,64,4,3,split,tma ...

Every runner is called three times first (Triton compiles, the tutorial autotunes), then once more
between cudaProfilerStart and cudaProfilerStop, so that ncu (with --profile-from-start off) reads only
that call's kernels. Runners: `diyflash` (the library's defaults: the tuned tiles, and the backward not
deterministic, as `flash_attention`'s), `tutorial` (the seed's Triton tutorial, see
bench/tutorial.py; its autotuned forward config is printed), and explicit tiles for one kernel,
KIND=block_m,block_n,warps,stages[,flag...] with KIND fwd, dkdv, dv (the dv pass of a split dk/dv) or
dq (a backward runner keeps the tuned tiles of the other kernels). --clock-control none: ncu would otherwise lock the clocks below
the boost clock that every benchmark here runs at.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.common import DTYPES


def parse_tiles(spec: str):
    """'dkdv=32,64,4,3,split,tma' -> ('dkdv', AttnConfig(32, 64, 4, 3, split=True, tma=True))."""
    from diyflash.kernels.attention_configs import AttnConfig

    kind, _, tiles = spec.partition("=")
    if kind not in ("fwd", "dkdv", "dv", "dq") or not tiles:
        raise ValueError(f"runner {spec!r}: expected diyflash, tutorial or KIND=bm,bn,warps,stages[,flag...]")
    parts = tiles.split(",")
    return kind, AttnConfig.from_tiles((*(int(x) for x in parts[:4]), *parts[4:]))


def runner(spec: str, q, k, v, causal: bool, mode: str):
    """The callable for one --run entry (the backward: the backward alone, the forward done once)."""
    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import bwd_config

    scale = q.shape[-1] ** -0.5
    if spec == "tutorial":
        from bench.tutorial import load_tutorial

        tut = load_tutorial()
        if mode == "fwd":
            def run():
                return tut.attention(q, k, v, causal, scale)

            run.after_warmup = lambda: print(f"tutorial forward config: {tut._attn_fwd.best_config}")
            return run
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = tut.attention(qg, kg, vg, causal, scale)
        dout = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    kind, cfg = ("", None) if spec == "diyflash" else parse_tiles(spec)
    if mode == "fwd":
        if kind not in ("", "fwd"):
            raise ValueError(f"runner {spec!r} in a forward probe")
        return lambda: ka.attention_fwd(q, k, v, causal, scale, None, config=cfg)
    out, lse = ka.attention_fwd(q, k, v, causal, scale, None)
    dout = torch.randn_like(out)
    tuned = bwd_config(q.shape[-1], q.dtype, q.device, causal, False, q.shape[-2])
    if kind == "fwd":
        raise ValueError(f"runner {spec!r} in a backward probe")
    both = tuned._replace(**{kind: cfg}) if kind else None
    # the library's default backward (not deterministic: the Hopper one-pass kernel on sm_90) for `diyflash`; explicit
    # tiles name the portable two-kernel backward's
    return lambda: ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, config=both,
                                    deterministic=bool(kind))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4x16x128", help="BxHxD")
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--kv-heads", type=int, default=None, help="k and v's heads (GQA; default: H)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--mode", choices=["fwd", "bwd"], default="fwd")
    parser.add_argument("--run", nargs="+", default=["diyflash"], help="runners, in this order")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    b, h, d = (int(x) for x in args.shape.split("x"))
    h_kv = args.kv_heads or h
    if h % h_kv or (h_kv != h and "tutorial" in args.run):
        parser.error(f"--kv-heads {h_kv}: must divide H = {h}, and the tutorial runner takes no GQA")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, heads, args.n, d, device="cuda", dtype=DTYPES[args.dtype], generator=gen)
               for heads in (h, h_kv, h_kv))
    runs = {spec: runner(spec, q, k, v, args.causal, args.mode) for spec in args.run}
    for spec, run in runs.items():
        for _ in range(3):
            run()
        getattr(run, "after_warmup", lambda: None)()
    torch.cuda.synchronize()
    for spec, run in runs.items():  # ncu numbers the profiled kernels in this order
        print(f"profiling {spec}", flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
