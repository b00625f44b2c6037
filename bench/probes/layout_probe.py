"""Probe (issue 26: why the transformers backend trails sdpa in training): the attention kernels on the
layout transformers passes, (B, H, N, D) views of (B, N, H, D) buffers ("bnhd"), against contiguous
(B, H, N, D) ("bhnd"), with the launch's TMA choices forced off one at a time (host descriptors, then TMA
altogether), SDPA cuDNN on the same tensors as the peer. Forward and backward TFLOPS, medians of
interleaved rounds.
    python -m bench.probes.layout_probe [--shapes 2x16x4x4096 1x16x4x16384]     (B x H x H_kv x N, D 128)"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import diyflash
from bench.attention import _inputs, prepare
from bench.common import attention_flops, interleaved_times, quantiles
from diyflash.kernels.attention import launch


def _variants():
    """name -> context setter: the launcher as it is, without host descriptors, without TMA."""
    tma_ok, min_work = launch.tma_ok, launch.HOST_DESC_MIN_WORK

    def restore():
        launch.tma_ok, launch.HOST_DESC_MIN_WORK = tma_ok, min_work
        launch._PLANS.clear()

    def no_host_desc():
        restore()
        launch.HOST_DESC_MIN_WORK = 1 << 62

    def no_tma():
        restore()
        launch.tma_ok = lambda *t: False

    return {"as is": restore, "no host desc": no_host_desc, "no TMA": no_tma}, restore


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["2x16x4x4096", "1x16x4x16384"])
    args = parser.parse_args(argv)
    variants, restore = _variants()
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | D128 bf16 causal, TFLOPS (median)")
    print("| B H/Hkv N | layout | pass | " + " | ".join(variants) + " | sdpa cudnn |")
    print("|---|---|---|" + "---|" * (len(variants) + 1))
    for shape in args.shapes:
        b, h, hkv, n = (int(x) for x in shape.split("x"))
        for layout in ("bhnd", "bnhd"):
            q, k, v = _inputs(b, h, hkv, n, 128, torch.bfloat16, layout)
            for mode in ("fwd", "bwd"):
                fns = {}
                for name, setter in variants.items():
                    setter()
                    fns[name] = prepare(lambda q, k, v, c: diyflash.flash_attention(q, k, v, causal=c), q, k, v,
                                        True, mode)

                def cudnn(q, k, v, c):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=c, enable_gqa=hkv != h)
                fns["sdpa cudnn"] = prepare(cudnn, q, k, v, True, mode)
                # a plan remembers its launch choices: each variant's setter runs before its own timing
                timed = {name: (lambda fn=fn, name=name: (variants.get(name, restore)(), fn())) for name, fn in
                         fns.items()}
                times = interleaved_times(timed, rounds=3, round_ms=60)
                flops = attention_flops(b, h, n, n, 128, True, mode)
                cells = [f"{flops / quantiles(times[name])[0] / 1e9:.0f}" for name in fns]
                print(f"| {b} {h}/{hkv} {n} | {layout} | {mode} | " + " | ".join(cells) + " |", flush=True)
    restore()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
