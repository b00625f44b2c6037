"""What the score clamp costs (issue 23: scores beyond fp32's range saturate instead of giving NaN).

bf16 and fp32 kernels now bound every raw score (one min per score in the forward and in both backward
kernels, kernels/attention.py `_scores`, `_probs`); fp16 kernels never needed it and are unchanged. This
times the same bf16 calls with the clamp (as shipped) and without it (the kernels as they were), in
turns, in one process: the without-clamp launches are planned once with `clamp_scores` patched off and
replayed from their own plan (both sides get the same explicit head group; the explicit tiles of the
side without the clamp, the tuned ones, give it a plan key of its own).

    python -m bench.probes.clamp_probe [--n 4096 16384]
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

from bench.common import attention_flops, interleaved_tflops


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["4x32x64", "4x16x128", "2x8x256"], help="BxHxD")
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    import diyflash  # noqa: F401
    import diyflash.kernels.attention as ka
    from diyflash.kernels._launch import cdiv
    from diyflash.kernels.attention_configs import bwd_config, fwd_config, head_dim_pad

    print(f"{'B H D':<10} {'causal':<6} {'N':>6} {'pass':<4} {'clamp':>7} {'no clamp':>9} {'ratio':>6}  (bf16 TFLOPS, in turns)")
    for shape in args.shapes:
        b, h, d = map(int, shape.split("x"))
        for causal in (False, True):
            for n in args.n:
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                scale = d ** -0.5
                out, lse = ka.attention_fwd(q, k, v, causal, scale, None)
                dout = torch.randn_like(out)
                pad = head_dim_pad(d)
                fcfg = fwd_config(pad, q.dtype, q.device, causal, False, n)
                bcfg = bwd_config(pad, q.dtype, q.device, causal, False, n)
                fgroup = ka.head_group(causal, cdiv(n, fcfg.block_m), b * h, q.device)
                bgroup = ka.head_group(causal, cdiv(n, bcfg.dq.block_m), b * h, q.device)
                calls = {
                    "fwd": (lambda: ka.attention_fwd(q, k, v, causal, scale, None, group=fgroup),
                            lambda: ka.attention_fwd(q, k, v, causal, scale, None, config=fcfg, group=fgroup)),
                    "bwd": (lambda: ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, group=bgroup),
                            lambda: ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, config=bcfg,
                                                     group=bgroup)),
                }
                for mode, (clamped, plain) in calls.items():
                    clamped()
                    with mock.patch.object(ka, "clamp_scores", lambda *a: False):
                        plain()  # compiles and plans the kernels without the clamp
                    tf = interleaved_tflops({"clamp": clamped, "plain": plain},
                                            attention_flops(b, h, n, n, d, causal, mode), args.rounds)
                    print(f"{shape:<10} {str(causal):<6} {n:>6} {mode:<4} {tf['clamp']:7.0f} {tf['plain']:9.0f} "
                          f"{tf['clamp'] / tf['plain']:6.3f}", flush=True)


if __name__ == "__main__":
    main()
