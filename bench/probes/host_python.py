"""Probe (issues 25, 26): the Python host path of an eager decode call, on a machine without a GPU.

CPU tensors stand in for CUDA ones and every launch is stubbed: the launchers see a compiled kernel
whose `run` does nothing, so what is timed is diyflash's own Python (checks, keys, plans, arguments,
allocations of CPU tensors), not Triton's C launcher or the CUDA allocator (bench/probes/host_budget.py
times those on the GPU machine: ~16 us a launch, ~4-7 us an allocation on the H200's host, whose Python
runs ~3-4x slower than a desktop's). The routes are those of bench/probes/decode_host.py: transformers'
decode step (the dense API, a cache one token longer every call) and flash_attention_with_kvcache.
    python -m bench.probes.host_python [--profile]"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import time

import torch

class _Compiled:
    """What DirectLauncher keeps of a compiled kernel, launching nothing."""

    function = packed_metadata = None

    @staticmethod
    def run(*args):
        pass

    @staticmethod
    def launch_metadata(*args):
        return None


@contextlib.contextmanager
def stubbed():
    """CPU tensors taken for CUDA ones by the launchers and the API, each launch a no-op."""
    import diyflash.api as api
    import diyflash.ops.attention as ops_attention
    import diyflash.ops.attention_kvcache as ops_kvcache
    from diyflash.kernels import _launch
    from diyflash.kernels.attention import kvcache, launch

    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def jit_launch(self, grid, args, meta):
        names = self.kernel.arg_names[len(args):]
        self._driver = (lambda: 0, lambda device: 0)
        self._compiled[self._signature(0, args, meta)] = (_Compiled, tuple(names))

    patch(_launch.DirectLauncher, "_jit_launch", jit_launch)
    patch(api, "_usual", lambda *tensors: True)
    patch(ops_attention, "uses_triton", lambda t: True)
    patch(ops_kvcache, "uses_triton", lambda t: True)
    patch(kvcache, "_sms", lambda device: 132)
    patch(torch.cuda, "current_device", lambda: 0)
    real_key = launch._plan_key

    def plan_key(kind, inputs, *args, **kwargs):  # _plan_key without its "only CUDA tensors have plans"
        first = inputs[0]
        return real_key(kind, (_CudaLike(first), *inputs[1:]), *args, **kwargs)

    patch(launch, "_plan_key", plan_key)  # kvcache._kv_key has no such condition
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


class _CudaLike:
    """A CPU tensor seen by _plan_key as a CUDA one."""

    is_cuda = True

    def __init__(self, t):
        self._t = t

    def __getattr__(self, name):
        return getattr(self._t, name)


def per_call_us(fn, calls: int = 3000) -> float:
    for _ in range(100):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls / 1e3)
    return best


def routes() -> dict:
    import diyflash

    q8 = torch.randn(8, 1, 16, 128, dtype=torch.bfloat16).transpose(1, 2)
    buf = torch.randn(2, 8 * 4 * 8192 * 128, dtype=torch.bfloat16)
    state = {"s": 4096}

    def growing():
        s = state["s"] = 4097 + (state["s"] - 4096) % 4000
        shape, stride = (8, 4, s, 128), (4 * s * 128, s * 128, 128, 1)
        return diyflash.flash_attention(q8, buf[0].as_strided(shape, stride), buf[1].as_strided(shape, stride),
                                        causal=True)

    k8 = buf[0].as_strided((8, 4, 4097, 128), (4 * 4097 * 128, 4097 * 128, 128, 1))
    q1 = torch.randn(1, 32, 1, 128, dtype=torch.bfloat16)
    k1 = torch.randn(1, 1024, 8, 128, dtype=torch.bfloat16).transpose(1, 2)
    lens = torch.full((1,), 1024, dtype=torch.int32)
    qt, kt, vt = (torch.randn(1, 4096, n, 128, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                  for n in (16, 4, 4))
    grad = torch.randn(1, 16, 4096, 128, dtype=torch.bfloat16)

    def train():  # a training step's attention: forward with autograd, then its backward
        with torch.enable_grad():
            out = diyflash.flash_attention(qt, kt, vt, causal=True)
            torch.autograd.grad(out, (qt, kt, vt), grad)

    return {
        "dense API fwd+bwd (autograd, B1 N4096)": train,
        "dense API, growing cache (transformers)": growing,
        "dense API, fixed cache": lambda: diyflash.flash_attention(q8, k8, k8, causal=True),
        "kvcache API validate=False": lambda: diyflash.flash_attention_with_kvcache(q1, k1, k1, lens, validate=False),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true", help="cProfile each route too")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("host_python stubs compiled launches: run it without TRITON_INTERPRET")
    with stubbed(), torch.no_grad():
        for name, fn in routes().items():
            print(f"{name:>40}: {per_call_us(fn):6.1f} us a call (launches stubbed)")
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(2000):
                    fn()
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
