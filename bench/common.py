"""What every benchmark row records: where and with what it was measured."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
import warnings

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # the benchmarks' --dtype(s) names


def attention_flops(b, h, n_q, n_k, d, causal, mode) -> float:
    """FLOPs of an attention pass (STYLE.md #11): fwd = 4 * B * H * N_q * N_k * D, halved when causal;
    bwd = 2.5 x fwd (2.0 for the backward's four matmuls + 0.5 for recomputing q k^T)."""
    fwd = 4.0 * b * h * n_q * n_k * d * (0.5 if causal else 1.0)
    return fwd * (2.5 if mode == "bwd" else 1.0)


def compiled_flex():
    """FlexAttention compiled for timing, or None where this torch has none. Returns a callable taking
    flex_attention's arguments. A sweep compiles flex once per (shape, dtype, mask, score_mod). Past
    dynamo's recompile limit (8) flex silently falls back to its unfused eager path (the full score
    matrix): the limit is raised, and a fallback that still happens raises instead of being timed (its
    warning becomes an error). The backward is timed by autograd.grad on a retained graph, which compiled
    flex refuses while it donates its saved buffers to the backward: donation is turned off."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return None
    from torch._functorch import config as functorch_config

    torch._dynamo.config.recompile_limit = 256
    functorch_config.donated_buffer = False
    compiled = torch.compile(flex_attention)

    def run(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="flex_attention called without torch.compile")
            return compiled(*args, **kwargs)

    return run


def provenance() -> dict:
    import diyflash

    try:
        import triton

        triton_version = triton.__version__
    except ModuleNotFoundError:
        triton_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton_version,
        "diyflash": diyflash.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # the DIYFLASH_* settings a run was made under, as a shell would set them
        "command": " ".join([*(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("DIYFLASH_")),
                             "python", *sys.orig_argv[1:]]),
    }


def per_call_us(fn, calls: int = 2000, warmup: int = 50) -> float:
    """Wall clock per call in a tight loop, one sync at the end: max(host cost, GPU time) per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def captured(calls, warm_calls: int = 1) -> torch.cuda.CUDAGraph:
    """One CUDA graph of `calls` (callables, in order), after running them `warm_calls` times on a side
    stream (compiles, allocator)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm_calls):
            for fn in calls:
                fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in calls:
            fn()
    return g


def graph_ms(fn, warm_calls: int = 1, **do_bench_kw) -> float:
    """GPU-only time of fn (ms, median): CUDA graph replay, no Python dispatch or launch cost. fn runs
    `warm_calls` times on a side stream first (compiles, allocator), then is captured once;
    do_bench_kw (warmup, rep) go to triton.testing.do_bench."""
    import triton

    return triton.testing.do_bench(captured([fn], warm_calls).replay, return_mode="median", **do_bench_kw)


_SCRUB: dict = {}


def clean_graph_ms(calls, reps: int = 60, warmup_ms: float = 25) -> float:
    """GPU time (ms, median of `reps`) of one replay of the graph of `calls` (see captured), the L2
    emptied before each replay by *reading* a 256 MB buffer. do_bench (graph_ms) empties it by zeroing
    such a buffer, and the dirty lines that leaves are written back to HBM while the timed kernel reads:
    a memory-bound call pays for them as if they were its own (+9-10 us on a 268 MB decode read on the
    H200, for every provider: bench/results/decode_timing_h200.txt). Each sample still holds one graph
    launch (an empty kernel's: 2.7 us on the H200). The replays run for `warmup_ms` first, as do_bench's
    do: without it, the first call timed in each of bench.decode's cells measured 75 us at B64 L1k, where
    the same kernel took 66 when timed later in the cell (five runs, H200); with it, 66.5."""
    g = captured(calls)
    device = torch.cuda.current_device()
    if device not in _SCRUB:
        _SCRUB[device] = torch.ones(128 << 20, dtype=torch.float16, device="cuda")

    def replay() -> float:
        _SCRUB[device].sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        replay()
    return statistics.median(replay() for _ in range(reps))


def interleaved_times(fns: dict, rounds: int = 5, round_ms: float = 50, warmup_ms: float = 25,
                      anchor: str | None = None) -> dict:
    """Times (ms, every sample) of each callable in `fns`, measured in `rounds` rounds that take the
    callables in turn, each round a triton.testing.do_bench of `round_ms`. A GPU's clocks move with
    power and heat over seconds, so callables timed one after the other can meet different clocks:
    the same diyflash tiles measured 392 TFLOPS in a sweep and 359 in the full benchmark (H200).
    Taken in turns, every callable meets every state alike. A kernel longer than
    `round_ms` still gives one sample a round.
    anchor: the name of one of `fns`, timed right before each of the others (its samples kept too), the
    others' order reversed every other round: a callable timed right after a slower one meets higher
    clocks (1.6-18 % on the H200, docs/performance.md), so each is timed after the same one instead."""
    import triton

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=warmup_ms, rep=round_ms, return_mode="all")

    if anchor is not None and anchor not in fns:
        raise ValueError(f"anchor {anchor!r} is not one of the callables {sorted(fns)}")
    times = {name: [] for name in fns}
    others = [name for name in fns if name != anchor]
    for r in range(rounds):
        for name in (others[::-1] if anchor is not None and r % 2 else others):
            if anchor is not None:
                times[anchor] += bench(fns[anchor])
            times[name] += bench(fns[name])
    return times


def interleaved_tflops(fns: dict, flops: float, rounds: int, round_ms: float = 40) -> dict:
    """TFLOPS of each callable in `fns` (each doing `flops`) from the median of its samples, timed in
    turns (interleaved_times): the probes' one number per callable."""
    times = interleaved_times(fns, rounds=rounds, round_ms=round_ms)
    return {name: flops / quantiles(t, (0.5,))[0] / 1e9 for name, t in times.items()}


def quantiles(samples, qs=(0.5, 0.2, 0.8)) -> tuple:
    """The qs-quantiles of a list of times (linear interpolation, as triton.testing.do_bench)."""
    t = torch.tensor(samples, dtype=torch.float64)
    return tuple(torch.quantile(t, torch.tensor(qs, dtype=torch.float64)).tolist())
