"""The seed's benchmark tools: benchmark_fn, BenchmarkResult, BenchmarkRunner.

`warmup` and `rep` are numbers of calls (as the seed documents them), not milliseconds. On CUDA each
timed call is bracketed by CUDA events; on CPU a wall clock (time.perf_counter) times each call.
The PyTorch baseline (torch.matmul, SDPA) is measured in the same run as the kernel under test.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F


@dataclass
class BenchmarkResult:
    name: str  # "PyTorch", "Triton", ...
    size: tuple  # the problem: (M, N, K) or (batch, heads, seq_len, head_dim)
    time_ms: float  # median
    tflops: float
    memory_mb: float = 0.0  # measured peak allocated during one call, above what was allocated before it
    block_config: Optional[dict] = None


def _quantile(sorted_times: list[float], q: float) -> float:
    if len(sorted_times) == 1:
        return sorted_times[0]
    pos = q * (len(sorted_times) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_times[lo] + (sorted_times[hi] - sorted_times[lo]) * (pos - lo)


def benchmark_fn(fn: Callable, *args, warmup: int = 25, rep: int = 100,
                 quantiles: Optional[list[float]] = None, **kwargs) -> tuple:
    """Time fn(*args, **kwargs): `warmup` untimed calls, then `rep` timed ones.

    Returns (median_ms, p20_ms, p80_ms), or the requested quantiles in order. CUDA: device time between
    CUDA events around each call; otherwise: wall clock per call.
    """
    if rep < 1:
        raise ValueError(f"rep must be at least 1, got {rep}")
    if quantiles is not None:
        bad = [q for q in quantiles if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1]
        if bad:
            raise ValueError(f"quantiles must be numbers in [0, 1], got {list(quantiles)}")
    on_cuda = torch.cuda.is_available() and any(
        isinstance(a, torch.Tensor) and a.is_cuda for a in (*args, *kwargs.values()))
    for _ in range(max(warmup, 0)):
        fn(*args, **kwargs)
    times = []
    if on_cuda:
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rep)]
        for start, end in events:
            start.record()
            fn(*args, **kwargs)
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in events]
    else:
        for _ in range(rep):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    qs = quantiles if quantiles is not None else [0.5, 0.2, 0.8]
    return tuple(_quantile(times, q) for q in qs)


def _peak_memory_mb(fn: Callable, device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0  # no allocator statistics on CPU
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


class BenchmarkRunner:
    """Runs kernel-vs-PyTorch comparisons and keeps the results for print_comparison_table."""

    def __init__(self, device: str = "cuda", warmup: int = 25, rep: int = 100):
        self.device = torch.device(device)
        self.warmup = warmup
        self.rep = rep
        self.results: list[BenchmarkResult] = []

    def _measure(self, name, size, flops, fn, block_config=None) -> BenchmarkResult:
        median, _, _ = benchmark_fn(fn, warmup=self.warmup, rep=self.rep)
        if not median > 0:
            raise ValueError(f"{name} {tuple(size)}: the measured median time is {median} ms, too short for the "
                             "clock to resolve; no throughput can be computed (benchmark a larger size)")
        result = BenchmarkResult(name=name, size=tuple(size), time_ms=median, tflops=flops / median / 1e9,
                                 memory_mb=_peak_memory_mb(fn, self.device), block_config=block_config)
        self.results.append(result)
        return result

    def benchmark_matmul(self, triton_fn: Callable, sizes: list[tuple[int, int, int]],
                         block_configs: Optional[list[dict]] = None,
                         dtype: torch.dtype = torch.float16) -> list[BenchmarkResult]:
        """For each (M, N, K): torch.matmul, then triton_fn(a, b) (or once per block config, passed as
        keyword arguments, e.g. {"block_m": 128, "block_n": 128, "block_k": 64}). FLOPs = 2*M*N*K."""
        out = []
        for m, n, k in sizes:
            a = torch.randn(m, k, device=self.device, dtype=dtype)
            b = torch.randn(k, n, device=self.device, dtype=dtype)
            flops = 2.0 * m * n * k
            out.append(self._measure("PyTorch", (m, n, k), flops, lambda: torch.matmul(a, b)))
            for cfg in block_configs or [None]:
                call = (lambda: triton_fn(a, b)) if cfg is None else (lambda cfg=cfg: triton_fn(a, b, **cfg))
                out.append(self._measure("Triton", (m, n, k), flops, call, block_config=cfg))
        return out

    def benchmark_attention(self, flash_fn: Callable, seq_lengths: list[int], batch_size: int = 4,
                            num_heads: int = 8, head_dim: int = 64, causal: bool = False,
                            dtype: torch.dtype = torch.float16) -> list[BenchmarkResult]:
        """For each length: PyTorch SDPA, then flash_fn(q, k, v, causal=causal). FLOPs = 4*B*H*N^2*D,
        halved when causal."""
        out = []
        for n in seq_lengths:
            q, k, v = (torch.randn(batch_size, num_heads, n, head_dim, device=self.device, dtype=dtype)
                       for _ in range(3))
            flops = 4.0 * batch_size * num_heads * n * n * head_dim * (0.5 if causal else 1.0)
            size = (batch_size, num_heads, n, head_dim)
            out.append(self._measure("PyTorch", size, flops,
                                     lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
            out.append(self._measure("Triton", size, flops, lambda: flash_fn(q, k, v, causal=causal)))
        return out

    def print_comparison_table(self, results: Optional[list[BenchmarkResult]] = None,
                               title: str = "Benchmark Results") -> None:
        print(format_comparison_table(self.results if results is None else results, title))

    def clear_results(self) -> None:
        self.results.clear()


def format_comparison_table(results: list[BenchmarkResult], title: str = "Benchmark Results") -> str:
    """Aligned table; speedup = PyTorch time of the same size / this time."""
    baseline = {r.size: r.time_ms for r in results if r.name == "PyTorch"}
    rows = []
    for r in results:
        cfg = "" if not r.block_config else " ".join(f"{k}={v}" for k, v in r.block_config.items())
        base = baseline.get(r.size)
        speedup = f"{base / r.time_ms:.2f}x" if base else "-"
        rows.append((r.name, "x".join(map(str, r.size)), f"{r.time_ms:.3f}", f"{r.tflops:.1f}",
                     f"{r.memory_mb:.1f}", speedup, cfg))
    header = ("name", "size", "time (ms)", "TFLOPS", "peak MB", "speedup", "config")
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "  ".join("-" * w for w in widths)
    fmt = lambda row: "  ".join(c.ljust(w) if i in (0, 1, 6) else c.rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    median_speedups = [baseline[r.size] / r.time_ms for r in results if r.name != "PyTorch" and r.size in baseline]
    summary = f"median speedup vs PyTorch: {statistics.median(median_speedups):.2f}x" if median_speedups else ""
    return "\n".join([title, fmt(header), line, *(fmt(r) for r in rows)] + ([summary] if summary else []))
