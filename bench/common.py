"""What every benchmark row records: where and with what it was measured."""

from __future__ import annotations

import datetime
import platform

import torch


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
    }


def graph_ms(fn, warm_calls: int = 1, **do_bench_kw) -> float:
    """GPU-only time of fn (ms, median): CUDA graph replay, no Python dispatch or launch cost. fn runs
    `warm_calls` times on a side stream first (compiles, allocator), then is captured once;
    do_bench_kw (warmup, rep) go to triton.testing.do_bench."""
    import triton

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm_calls):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, return_mode="median", **do_bench_kw)
