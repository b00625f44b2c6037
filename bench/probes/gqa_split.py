"""Probe (issue 26: the GQA backward on small grids): the dk/dv kernel with each kv head's query-head group
split over 1, 2, .. kv_group programs (launch.head_split; the parts' fp32 sums added by one more launch),
and the launcher's own choice, against SDPA cuDNN's backward on the same tensors. D128 bf16, the (B, N, H, D)
buffers transformers passes, backward TFLOPS (medians of interleaved rounds).
    python -m bench.probes.gqa_split [--shapes 1x16x4x4096 ...] [--causal both|true|false]   (B x H x H_kv x N)"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.attention import _inputs, prepare
from bench.common import attention_flops, interleaved_times, quantiles
from diyflash.kernels.attention import launch
from diyflash.kernels.attention_configs import bwd_config

SHAPES = ["1x16x4x512", "1x16x4x1024", "1x16x4x2048", "1x16x4x4096", "1x16x4x8192", "1x16x4x16384", "2x16x4x4096",
          "1x32x8x1024", "1x32x8x4096", "1x64x8x4096"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--causal", choices=["both", "true", "false"], default="both")
    args = parser.parse_args(argv)
    causals = {"both": (True, False), "true": (True,), "false": (False,)}[args.causal]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()} ({sms} SMs) | torch {torch.__version__} | D128 bf16 bnhd, "
          "backward TFLOPS (median); 'auto' = launch.head_split's choice, in brackets")
    print("| B H/Hkv N | causal | split 1 | split 2 | split 4 | split 8 | auto | sdpa cudnn | auto / cudnn |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        b, h, hkv, n = (int(x) for x in shape.split("x"))
        group = h // hkv
        q, k, v = _inputs(b, h, hkv, n, 128, torch.bfloat16, "bnhd")
        dout = torch.randn_like(q)
        scale = 128 ** -0.5
        for causal in causals:
            out, lse = launch.attention_fwd(q, k, v, causal, scale, None)
            fns = {}
            for split in (1, 2, 4, 8):
                if split <= group and group % split == 0:
                    fns[f"split {split}"] = (lambda s=split: launch.attention_bwd(dout, None, q, k, v, out, lse, causal,
                                                                                  scale, None, split=s))
            fns["auto"] = lambda: launch.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None)

            def cudnn(q, k, v, c):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=c, enable_gqa=True)

            fns["sdpa cudnn"] = prepare(cudnn, q, k, v, causal, "bwd")
            for fn in fns.values():
                fn()
            times = interleaved_times(fns, rounds=3, round_ms=60)
            flops = attention_flops(b, h, n, n, 128, causal, "bwd")
            tf = {name: flops / quantiles(t)[0] / 1e9 for name, t in times.items()}
            block_n = bwd_config(128, q.dtype, q.device, causal, False, n).dkdv.block_n
            programs = -(-n // block_n) * hkv * b
            auto = launch.head_split(group, programs, b * h * n * n * 128, q.device)
            cells = [f"{tf[f'split {s}']:.0f}" if f"split {s}" in tf else "-" for s in (1, 2, 4, 8)]
            print(f"| {b} {h}/{hkv} {n} | {causal} | " + " | ".join(cells)
                  + f" | {tf['auto']:.0f} [{auto}] | {tf['sdpa cudnn']:.0f} | {tf['auto'] / tf['sdpa cudnn']:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
