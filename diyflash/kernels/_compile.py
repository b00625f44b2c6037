"""Compiling ahead, and hashing kernels in one order: what DirectLauncher (_launch.py) does before a compile."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Callable

import torch

from ._runtime import PLAIN, env_flag


# Compiling ahead. A call's kernels compile one after the other where each is first launched, but most of a
# compile runs without the GIL (Triton's MLIR passes, LLVM, ptxas): compiled on worker threads, the kernels a
# call will launch next (a forward's second pass, the backward of a forward that needs gradients) build while
# the caller compiles the one it launches now: the first forward + backward with empty caches took 0.60x the
# time of compiling each kernel at its launch (H200, bench/results/coldstart_compile_ahead_h200.jsonl).
# DIYFLASH_COMPILE_AHEAD=0 compiles each kernel at its launch only. Nothing to do under the interpreter or
# DIYFLASH_PLAIN.
COMPILE_AHEAD = env_flag("DIYFLASH_COMPILE_AHEAD", "1") and not PLAIN
AHEAD_THREADS = 4


def compile_ahead_on() -> bool:
    """Whether launchers compile ahead (COMPILE_AHEAD: read here, so a test may switch it)."""
    return COMPILE_AHEAD


_ahead_pool: list = []  # the worker threads' executor, made at the first compile ahead
_ahead_lock = threading.Lock()


def _ahead_executor() -> concurrent.futures.ThreadPoolExecutor:
    with _ahead_lock:
        if not _ahead_pool:
            _ahead_pool.append(concurrent.futures.ThreadPoolExecutor(
                min(AHEAD_THREADS, os.cpu_count() or 1), thread_name_prefix="diyflash-compile"))
        return _ahead_pool[0]


if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads: it makes its own pool
    os.register_at_fork(after_in_child=_ahead_pool.clear)


def submit(kernel, device: int, grid, args: tuple, meta: dict) -> concurrent.futures.Future:
    """Compile kernel for a launch with these arguments on a worker thread (_compile_only); its future."""
    return _ahead_executor().submit(_compile_only, kernel, device, grid, args, meta)


def _compile_only(kernel, device: int, grid, args: tuple, meta: dict) -> None:
    """A worker thread's compile of kernel for these arguments, on the caller's device (the JIT keys its
    compiled kernels per device, and a thread starts on device 0). An error is left to the launch, which
    compiles again and raises it where the caller sees it."""
    try:
        with torch.cuda.device(device):
            kernel.warmup(*args, grid=grid, **meta)
    except Exception:  # noqa: BLE001  (the launch raises it)
        pass


# Triton keys a compiled kernel (in its disk cache too) on a hash of its source and of the functions it calls,
# computed once per process; on the H200 machine (Triton 3.6) the attention forward's hash came out otherwise
# where the backward's kernels had been hashed first (a forward whose backward compiled ahead) than where they
# had not, and hashes computed on two threads at once varied from process to process, so a later process could
# miss the cache and compile again (bench/results/kernel_hash_order_h200.txt). So before its first compile a
# process hashes the kernels registered here in one order, on one thread, and a compile ahead hashes its kernel
# in the calling thread.
_HASH_FIRST: list[Callable] = []  # callables returning kernels, hashed in this order before the first compile
_hash_lock = threading.Lock()
_hashed = [False]


def hash_first(kernels: Callable) -> None:
    """Register `kernels()` (an iterable of @triton.jit kernels) to be hashed before this process compiles any
    kernel through a DirectLauncher (settle_hashes)."""
    _HASH_FIRST.append(kernels)


def settle_hashes() -> None:
    """Compute the source hash (Triton's `cache_key`) of every kernel registered with hash_first, in their order,
    once per process: a kernel's cache key is then the same whatever this process compiles first."""
    if _hashed[0]:
        return
    with _hash_lock:
        if not _hashed[0]:
            for kernels in _HASH_FIRST:
                for kernel in kernels():
                    try:
                        getattr(kernel, "cache_key", None)
                    except Exception:  # noqa: BLE001  (its own compile hashes it again and raises there)
                        kernel.hash = None  # (Triton leaves its placeholder where the hash failed)
            _hashed[0] = True
