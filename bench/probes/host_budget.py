"""Probe (issues 25, 26: the host cost of an eager decode call): what the pieces of a call cost on this
host, each alone in a loop (tensor attributes, allocations, the checks' torch calls, one bound Triton
launch, the plan keys), beside cProfile of the two decode routes users take: transformers' (the dense
API on a cache one token longer every call, B8 H16/4 D128 bf16) and flash_attention_with_kvcache
(validate=False, B1 H32/8 L1k). Everything below is host time: the GPU work of these calls is ~10-20 us.
    python -m bench.probes.host_budget [--rows 30]"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import diyflash
from bench.probes.decode_host import _growing_cache
from diyflash.kernels import device_guard
from diyflash.ops.eager import dispatcher_free


def _ns(fn, calls: int = 20000) -> float:
    """Host time of fn per call (us), the loop's own cost taken off."""
    def loop(f):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            f()
        return time.perf_counter_ns() - t0

    loop(fn)
    best = min(loop(fn) for _ in range(5))
    empty = min(loop(lambda: None) for _ in range(5))
    return (best - empty) / calls / 1e3


def _one_buffer(splits):
    buf = torch.empty(32 * splits * 129, dtype=torch.float32, device="cuda")
    return (buf.as_strided((1, 32, 1, splits, 128), (32 * splits * 128, splits * 128, splits * 128, 128, 1)),
            buf.as_strided((1, 32, 1, splits), (32 * splits, splits, splits, 1), 32 * splits * 128))


def _guarded(q):
    with device_guard(q):
        pass


def primitives() -> dict[str, float]:
    from diyflash.kernels._launch import runtime_key
    from diyflash.kernels.attention import kvcache as kv
    from diyflash.kernels.attention.launch import _layout, _plan_key

    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    lens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
    diyflash.flash_attention_with_kvcache(q, k, k, lens, validate=False)  # a plan to take a bound launch from
    plan = list(kv._KV_PLANS.values())[-1]
    splits = kv.num_splits_for(1, 8, 1, 1024, q.device)
    var = kv.variant(False, (-1, -1), 0.0, 1, 1024, 32, 8)
    bound, getter = plan.launches[0]
    env = {"q": q, "k_cache": k, "v_cache": k, "cache_seqlens": lens, "block_table": None, "alibi": None, "sinks": None,
           "dst": torch.empty(1, 32, 1, splits, 128, device="cuda"), "dst_lse": torch.empty(1, 32, 1, splits, device="cuda")}
    pointers = getter(env)
    from triton.runtime import driver

    get_stream = driver.active.get_current_stream
    inputs = (q, k, k, lens, None, None, None, None, None)
    kc = k.contiguous()
    out = {
        "t.shape": lambda: q.shape,
        "t.stride()": lambda: q.stride(),
        "t.data_ptr()": lambda: q.data_ptr(),
        "t.dtype": lambda: q.dtype,
        "t.is_cuda": lambda: q.is_cuda,
        "t.device": lambda: q.device,
        "t.get_device()": lambda: q.get_device(),
        "torch.empty (1,32,1,128) bf16": lambda: torch.empty((1, 32, 1, 128), dtype=torch.bfloat16, device="cuda"),
        "torch.empty, device object": lambda: torch.empty((1, 32, 1, 128), dtype=torch.bfloat16, device=q.device),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "2 x torch.empty (partials)": lambda: (torch.empty((1, 32, 1, splits, 128), dtype=torch.float32, device="cuda"),
                                               torch.empty((1, 32, 1, splits), dtype=torch.float32, device="cuda")),
        "torch.empty + 2 x as_strided": lambda: _one_buffer(splits),
        "q.new_empty": lambda: q.new_empty((1, 32, 1)),
        "torch.cuda.current_device()": torch.cuda.current_device,
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "triton get_current_stream(0)": lambda: get_stream(0),
        "runtime_key()": runtime_key,
        "with device_guard(q)": lambda: _guarded(q),
        "dispatcher_free(q, k, k)": lambda: dispatcher_free(q, k, k),
        "torch.is_autocast_enabled('cuda')": lambda: torch.is_autocast_enabled("cuda"),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "torch.is_grad_enabled()": torch.is_grad_enabled,
        "_layout(k)": lambda: _layout(k),
        "kvcache._kv_key(...)": lambda: kv._kv_key(q, k, k, 1, (lens, None, None, None, None, None), var, 0.1, 0,
                                                   splits, (*k.stride(), *k.stride(), 1024, 1025, 0)),
        "_plan_key(kvcache inputs)": lambda: _plan_key("kvcache", inputs, (False, (-1, -1), 0.0), 0.1, (0,)),
        "bound decode launch": lambda: bound(*pointers),
        "sdpa (default) whole call": lambda: F.scaled_dot_product_attention(q, kc, kc, enable_gqa=True),
    }
    res = {}
    for name, fn in out.items():
        calls = 2000 if "launch" in name or "sdpa" in name else 20000
        res[name] = _ns(fn, calls)
        torch.cuda.synchronize()
    return res


def _profile(fn, calls: int, rows: int, sort: str) -> None:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats(sort).print_stats(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | host time per call, best of 5 loops")
    for name, us in primitives().items():
        print(f"{name:>42}: {us:7.2f} us")

    q = torch.randn(8, 1, 16, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    next_kv = _growing_cache(8, 4, 4096, 3000)

    def dense():
        k, v = next_kv()
        return diyflash.flash_attention(q, k, v, causal=True)

    q1 = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k1 = torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    lens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")

    def kvcache():
        return diyflash.flash_attention_with_kvcache(q1, k1, k1, lens, validate=False)

    for name, fn in (("dense API, growing cache (transformers' decode route)", dense),
                     ("flash_attention_with_kvcache validate=False, fixed shapes", kvcache)):
        print(f"\n## {name}: {_ns(fn, 1000):.1f} us a call (loop, no profiler)")
        _profile(fn, 1000, args.rows, "tottime")


if __name__ == "__main__":
    main()
