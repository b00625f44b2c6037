"""Probe (issue 25, host cost of one eager decode call): where the ~200 us of an eager
flash_attention_with_kvcache call go. B1, 32 heads / 8 kv heads, D128 bf16, a 1k cache (the GPU takes
~13 us, so every loop below is bound by the host). Prints per-call wall time of each layer (API, the op,
the launcher alone, SDPA cuDNN as the peer), the dense API against a cache that grows every call (as
transformers' DynamicCache), then cProfile's top functions of the API call.
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
    growing()
    _profile(fns["api validate=False"], 300, 25)


def _profile(fn, calls: int, rows: int) -> None:
    """cProfile's top `rows` functions by own time over `calls` calls of fn."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(rows)


def _growing_cache(b: int, h_kv: int, start: int, calls: int, d: int = 128):
    """next_kv() -> (k, v) (B, H_kv, S, D) contiguous, S one longer each call from `start`: what transformers'
    DynamicCache hands a decode step (torch.cat: new length, new strides), as views of one buffer."""
    buf = torch.randn(2, b * h_kv * (start + calls + 1) * d, device="cuda", dtype=torch.bfloat16)
    state = {"s": start}

    def next_kv():
        s = state["s"] = state["s"] + 1
        if s > start + calls:
            s = state["s"] = start + 1  # past the buffer: start over (those shapes were seen before)
        shape, stride = (b, h_kv, s, d), (h_kv * s * d, s * d, d, 1)
        return buf[0].as_strided(shape, stride), buf[1].as_strided(shape, stride)

    return next_kv


def growing(rounds: int = 5, calls: int = 200):
    """A decode step as transformers' generate makes it (bench.hf_model's model: B8, 16 heads / 4 kv heads,
    D128, a 4k prompt): one query row against a cache one token longer every call, so no two calls share a
    shape. The dense API (the backend's route) against SDPA, each given new lengths every call."""
    q = torch.randn(8, 1, 16, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    kv = {name: _growing_cache(8, 4, 4096, rounds * (calls + 20) + 220) for name in ("api", "launcher", "default")}

    def api():
        k, v = kv["api"]()
        return diyflash.flash_attention(q, k, v, causal=True)

    def launcher():
        k, v = kv["launcher"]()
        return _kernels().attention_fwd(q, k, v, True, 128 ** -0.5, None)

    def default():
        k, v = kv["default"]()
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    # SDPA cuDNN builds a graph for every new shape: 43-47 ms a call here (H200, 2026-11-24), left out
    fns = {"dense api, growing cache": api, "launcher, growing cache": launcher, "sdpa (default), growing": default}
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(per_call_us(fn, calls, warmup=20))
    print("# B8 H16/4 D128 bf16, one query row, a cache from 4097 keys growing by one each call")
    for name, ts in times.items():
        print(f"{name:>24}: {statistics.median(ts):7.1f} us/call (min {min(ts):.1f})")
    _profile(api, 200, 15)


if __name__ == "__main__":
    main()
