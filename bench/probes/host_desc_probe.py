"""Probe: where do host-built TMA descriptors start to pay? (kernels.attention.HOST_DESC_MIN_WORK)

    python -m bench.probes.host_desc_probe [--head-dims 128 256] [--ns 128 256 384 512 768 1024] [--rounds 5]
        (H200 answer: bench/results/attention_host_desc_probe_h200.txt)

Host descriptors cost host time on every call (~18 us on the H200 host for three of them) and save each
program building its own in global memory. For each forward cell (B = 16 and the benchmark's H for
head_dim: the short-sequence sweep's shapes, fp16, causal and not) whose tuned tiles read through TMA,
this times an eager diyflash.flash_attention call in a tight loop, which is max(host cost, GPU time)
per call, with the threshold forced to 0 (host descriptors) and to 2^62 (per-program ones), in turns,
`rounds` times; medians in microseconds, and the cell's work Z*H*N_q*N_k*padded head_dim against
the threshold the launcher uses now.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--ns", type=int, nargs="+", default=[128, 256, 384, 512, 768, 1024])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_desc_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    import diyflash
    from bench.attention_configs import SHAPES
    from bench.common import per_call_us
    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import fwd_config, head_dim_pad

    now = ka.HOST_DESC_MIN_WORK
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
          f"per call in a tight loop, us, medians of {args.rounds} rounds in turns; threshold now 2^{now.bit_length() - 1}")
    variants = {"host": 0, "per-program": 1 << 62}
    try:
        for d in args.head_dims:
            h = SHAPES.get(head_dim_pad(d), (2, 8))[1]
            for causal in (False, True):
                for n in args.ns:
                    q, k, v = (torch.randn(16, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
                    if not fwd_config(head_dim_pad(d), q.dtype, q.device, causal, False, n).tma:
                        continue
                    times = {name: [] for name in variants}
                    for _ in range(args.rounds):
                        for name, threshold in variants.items():
                            ka.HOST_DESC_MIN_WORK = threshold
                            ka._PLANS.clear()  # a plan remembers whether it builds host descriptors
                            times[name].append(per_call_us(lambda: diyflash.flash_attention(q, k, v, causal=causal),
                                                           calls=300))
                    med = {name: statistics.median(ts) for name, ts in times.items()}
                    work = 16 * h * n * n * head_dim_pad(d)
                    print(f"D{d} H{h} N{n} {'causal' if causal else 'plain'}: work 2^{work.bit_length() - 1:<3} "
                          f"({'host' if work >= now else 'per-program'} now) host {med['host']:7.1f} | "
                          f"per-program {med['per-program']:7.1f} | ratio {med['host'] / med['per-program']:.3f}")
    finally:
        ka.HOST_DESC_MIN_WORK = now
        ka._PLANS.clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
