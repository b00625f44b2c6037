"""Probe (issue 25, host cost of one eager decode call): where the ~200 us of an eager
flash_attention_with_kvcache call go. B1, 32 heads / 8 kv heads, D128 bf16, a 1k cache (the GPU takes
~13 us, so every loop below is bound by the host). Prints per-call wall time of each layer (API, the op,
the launcher alone, SDPA cuDNN as the peer), then cProfile's top functions of the API call.
    python -m bench.probes.decode_host"""

from __future__ import annotations

import cProfile
import pstats
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import diyflash
from bench.common import per_call_us
from diyflash.ops.attention import _kernels
from diyflash.ops.attention_kvcache import _impl


def _unguarded(q, k, v, lens, scale):
    """_impl's work without device_guard (the launcher alone plus the argument handling)."""
    return _kernels().attention_kvcache(q, k, v, lens.contiguous(), None, None, None, False, scale)


def main():
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    kc, vc = k.contiguous(), v.contiguous()
    lens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
    scale = 128 ** -0.5
    fns = {
        "api validate=False": lambda: diyflash.flash_attention_with_kvcache(q, k, v, lens, validate=False),
        "api": lambda: diyflash.flash_attention_with_kvcache(q, k, v, lens),
        "torch.ops (dispatcher)": lambda: torch.ops.diyflash.attention_with_kvcache(q, k, v, lens),
        "op impl (no API checks)": lambda: _impl(q, k, v, lens),
        "dense api flash_attention": lambda: diyflash.flash_attention(q, k, v, causal=True),
        "op impl, no device guard": lambda: _unguarded(q, k, v, lens, scale),
        "launcher alone": lambda: _kernels().attention_kvcache(q, k, v, lens, None, None, None, False, scale),
        "launcher, 1 split": lambda: _kernels().attention_kvcache(q, k, v, lens, None, None, None, False, scale,
                                                                  num_splits=1),
        "torch.empty x2": lambda: (torch.empty(1, 32, 1, 128, device="cuda"), torch.empty(1, 32, 1, device="cuda")),
    }

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    fns["sdpa cudnn"] = cudnn
    fns["sdpa (default)"] = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | median of 7 rounds, the layers in turns")
    times = {name: [] for name in fns}
    for _ in range(7):  # in turns, so that clock ramps and drift reach every layer alike
        for name, fn in fns.items():
            times[name].append(per_call_us(fn, 200, warmup=20))
    for name, ts in times.items():
        print(f"{name:>24}: {statistics.median(ts):7.1f} us/call (min {min(ts):.1f})")
    fn = fns["api validate=False"]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
