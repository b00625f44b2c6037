"""Sweep the attention tile configurations on the GPU and print the fastest per head_dim.

    python -m bench.attention_configs [--n 4096] [--dtype fp16] [--out results/configs.jsonl]

Each candidate of diyflash/kernels/attention_configs.py (FWD_CANDIDATES, BWD_CANDIDATES) that fits
the device's shared memory is checked against the default config's result, then timed (median of
triton.testing.do_bench). The winners are what the tables in attention_configs.py should hold.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from bench.common import provenance


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="sequence length")
    parser.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--kinds", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    parser.add_argument("--out", default=None, help="append JSONL rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_configs: needs a CUDA GPU", file=sys.stderr)
        return 2

    import triton

    from diyflash.kernels import attention as ka
    from diyflash.kernels.attention_configs import (
        BWD_CANDIDATES, FWD_CANDIDATES, bwd_config, fwd_config, smem_bytes_bwd, smem_bytes_fwd,
    )

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    shapes = {64: (4, 32), 128: (4, 16), 256: (2, 8)}
    rows = []
    for d in args.head_dims:
        b, h = shapes.get(d, (2, 8))
        n = args.n
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
        scale = d ** -0.5
        flops = 4 * b * h * n * n * d * (0.5 if args.causal else 1.0)
        ref_out, ref_lse = ka.attention_fwd(q, k, v, args.causal, scale, None)
        dout = torch.randn_like(q)
        ref_grads = ka.attention_bwd(dout, None, q, k, v, ref_out, ref_lse, args.causal, scale, None)
        for kind, cands, cost, default in (
            ("fwd", FWD_CANDIDATES, smem_bytes_fwd, fwd_config(d, dtype, q.device, False)),
            ("bwd", BWD_CANDIDATES, smem_bytes_bwd, bwd_config(d, dtype, q.device, False)),
        ):
            if kind not in args.kinds:
                continue
            results = []
            for cfg in cands:
                if cost(cfg, d, dtype.itemsize) > limit:
                    continue
                try:
                    if kind == "fwd":
                        fn = lambda cfg=cfg: ka.attention_fwd(q, k, v, args.causal, scale, None, config=cfg)  # noqa: E731
                        got = fn()[0]
                        ok = (got - ref_out).abs().max().item() < 1e-2
                    else:
                        fn = lambda cfg=cfg: ka.attention_bwd(  # noqa: E731
                            dout, None, q, k, v, ref_out, ref_lse, args.causal, scale, None, config=cfg)
                        got = fn()
                        ok = all((a - r).abs().max().item() < 5e-2 for a, r in zip(got, ref_grads))
                    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                except Exception as e:  # out of resources on this GPU: not a candidate here
                    print(f"  skip {kind} d={d} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                    continue
                tflops = flops * (2.5 if kind == "bwd" else 1.0) / ms / 1e9
                row = dict(kind=kind, head_dim=d, n=n, b=b, h=h, causal=args.causal, dtype=args.dtype,
                           ok=ok, ms=ms, tflops=tflops, is_default=cfg == default, **cfg.as_dict())
                results.append(row)
                rows.append(row)
            good = sorted((r for r in results if r["ok"]), key=lambda r: r["ms"])
            bad = [r for r in results if not r["ok"]]
            if bad:
                print(f"  WRONG RESULTS {kind} d={d}: {[(r['block_m'], r['block_n'], r['num_warps'], r['num_stages']) for r in bad]}")
            dflt = next((r for r in results if r["is_default"]), None)
            for r in good[:3]:
                print(f"{kind} d={d} causal={args.causal}: {r['block_m']}x{r['block_n']} w{r['num_warps']} "
                      f"s{r['num_stages']} {r['tflops']:.0f} TFLOPS")
            if dflt:
                print(f"{kind} d={d} default {dflt['block_m']}x{dflt['block_n']} w{dflt['num_warps']} "
                      f"s{dflt['num_stages']}: {dflt['tflops']:.0f} TFLOPS")
    if args.out:
        prov = provenance()
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps({**prov, **r}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
