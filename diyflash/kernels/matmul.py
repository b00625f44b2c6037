"""C = A @ B in Triton: a persistent, grouped-order kernel and its launcher.

Ladder: `_matmul_kernel` (jit) -> `matmul` (launcher) -> `diyflash::matmul` (op) ->
`diyflash.triton_matmul` (public). This module knows nothing of torch.library.

Two ways to read the operands, one kernel body (USE_TMA is a constexpr):
- Tensor descriptors (TMA on Hopper): when A, B and C meet TMA's rules (16-byte aligned base and
  row strides, unit stride on one dim). A transposed view (stride 1 along M for A, along N for B)
  is described through its row-major storage and transposed in registers/shared memory, so
  `a.mT @ b` is read in place. Out-of-range tiles are zero-filled by the hardware.
- Masked pointer loads with 64-bit offsets: any strides at all (stride 0 from expand() too).

Tiles are visited in grouped order (GROUP_M rows of tiles at a time) so that a wave of programs
shares A and B tiles in L2. With PERSISTENT the grid is one program per SM, each looping over tiles.
"""

from __future__ import annotations

import functools
import threading
from typing import NamedTuple

import torch

from ._runtime import PLAIN, device_limits, keep, remember, require_triton
from .matmul_configs import (
    INTERPRETER_CONFIG, MatmulConfig, bucket, candidates, default_config, manual_config, tma_layout,
)

triton = require_triton()
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from . import tuning_cache as disk_cache  # noqa: E402
from ._launch import DirectLauncher, cdiv  # noqa: E402


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering: walk GROUP_M tile-rows down a column before moving right (L2 reuse)."""
    group_size = GROUP_M * num_pid_n
    group_id = tile_id // group_size
    first_m = group_id * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group_size) % rows
    pid_n = (tile_id % group_size) // rows
    return pid_m, pid_n


@triton.jit
def _matmul_kernel(
    a, b, c,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, A_TRANS: tl.constexpr, B_TRANS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """a, b, c are tensor descriptors when USE_TMA else pointers. With TMA, A_TRANS means a's
    descriptor is over A^T (shape (K, M)) and B_TRANS that b's is over B^T (shape (N, K))."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)

    for tile_id in tl.range(pid, num_tiles, num_programs):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M=GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if not USE_TMA:
            # 64-bit row offsets: M * stride_am alone can pass 2^31 elements
            a_ptrs = a + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b + offs_k[:, None] * stride_bk + offs_n.to(tl.int64)[None, :] * stride_bn
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            if USE_TMA:
                if A_TRANS:
                    a_tile = tl.trans(a.load([off_k, off_m]))
                else:
                    a_tile = a.load([off_m, off_k])
                if B_TRANS:
                    b_tile = tl.trans(b.load([off_n, off_k]))
                else:
                    b_tile = b.load([off_k, off_n])
            else:
                k_in = off_k + offs_k < K
                a_tile = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_in[None, :], other=0.0)
                b_tile = tl.load(b_ptrs, mask=k_in[:, None] & (offs_n[None, :] < N), other=0.0)
                a_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
            if UPCAST:  # interpreter only: its bf16 tl.dot is wrong (triton-lang/triton#11584)
                a_tile = a_tile.to(tl.float32)
                b_tile = b_tile.to(tl.float32)
            acc = tl.dot(a_tile, b_tile, acc, input_precision=DOT_PRECISION)
        if USE_TMA:
            c.store([off_m, off_n], acc.to(c.dtype))
        else:
            c_ptrs = c + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def dot_precision(allow_tf32: bool) -> str:
    # fp32 stays fp32-accurate unless TF32 is asked for; fp16/bf16 ignore the setting
    return "tf32" if allow_tf32 else "ieee"


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few persistent programs exercise the tile loop
    return torch.cuda.get_device_properties(device).multi_processor_count


class Plan(NamedTuple):
    """Everything about a launch that follows from the operands' shapes, strides, dtype and alignment."""

    cfg: MatmulConfig
    layout: tuple[bool, bool] | None  # (a_trans, b_trans) for tensor descriptors, None for pointer loads
    programs: int  # grid size: one program per tile, or per SM slot when persistent


def plan(a: torch.Tensor, b: torch.Tensor, cfg: MatmulConfig) -> Plan:
    m, n = a.shape[0], b.shape[1]
    layout = tma_layout(a, b) if cfg.use_tma and device_limits(a.device).tma else None
    num_tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    programs = min(num_tiles, _num_sms(a.device) * cfg.programs_per_sm) if cfg.persistent else num_tiles
    return Plan(cfg, layout, programs)


_KERNEL = DirectLauncher(_matmul_kernel)


def matmul(a: torch.Tensor, b: torch.Tensor, cfg: MatmulConfig, allow_tf32: bool = False) -> torch.Tensor:
    """Launch C = A @ B with one config. a: (M, K), b: (K, N), any strides; c: (M, N) contiguous."""
    return run(a, b, plan(a, b, cfg), allow_tf32)


def run(a: torch.Tensor, b: torch.Tensor, p: Plan, allow_tf32: bool = False) -> torch.Tensor:
    """Launch C = A @ B with a plan made for operands like these (same shapes, strides, alignment)."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    cfg = p.cfg
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if p.layout is not None:
        # descriptors over the row-major storage; a transposed operand is described as its transpose
        a_trans, b_trans = p.layout
        sa, sb = a.stride(), b.stride()
        a_arg = TensorDescriptor(a, [k, m], [sa[1], 1], [bk, bm]) if a_trans else TensorDescriptor(a, [m, k], [sa[0], 1], [bm, bk])
        b_arg = TensorDescriptor(b, [n, k], [sb[1], 1], [bn, bk]) if b_trans else TensorDescriptor(b, [k, n], [sb[0], 1], [bk, bn])
        c_arg = TensorDescriptor(c, [m, n], [n, 1], [bm, bn])
    else:
        a_trans = b_trans = False
        a_arg, b_arg, c_arg = a, b, c
    _KERNEL(
        (p.programs,),
        a_arg, b_arg, c_arg,
        m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), n, 1,
        p.programs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        USE_TMA=p.layout is not None, A_TRANS=a_trans, B_TRANS=b_trans,
        DOT_PRECISION=dot_precision(allow_tf32),
        UPCAST=a.dtype == torch.bfloat16 and _KERNEL.interpreted,  # the interpreter's bf16 dot is wrong
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return c


# ----------------------------------------------------------------------------------------------------
# Autotuning: each candidate is timed once per key on the caller's own operands, the winner cached
# for the life of the process and on disk (kernels/tuning_cache.py; tuning_cache() shows what was chosen). Candidates are timed by CUDA
# graph replay, i.e. GPU time only: timed eagerly, a 1024^3 product's ~10 us on the GPU hides under
# ~50 us of host launch cost that every candidate pays alike, and the ranking was noise (a 32-tile
# config won on a 132-SM GPU at 0.46x of cuBLAS).
# ----------------------------------------------------------------------------------------------------
_TUNED: dict[tuple, tuple[MatmulConfig, float]] = {}


def tuning_key(a: torch.Tensor, b: torch.Tensor, allow_tf32: bool) -> tuple:
    # plain objects, no string formatting: this runs on every call (~4 us with str(device) on an H200)
    m, k = a.shape
    n = b.shape[1]
    return (a.device, a.dtype, allow_tf32, tma_layout(a, b), bucket(m), bucket(n), bucket(k))


def tuning_cache() -> dict[tuple, dict]:
    """What the autotuner chose so far: key -> config (and its measured milliseconds)."""
    return {(str(key[0]), str(key[1]), *key[2:]): {**cfg.as_dict(), "ms": ms} for key, (cfg, ms) in _TUNED.items()}


def graph_ms(fn, device: torch.device, rep_ms: float = 20.0, replays: int = 10) -> float:
    """GPU time of fn (ms, median over `replays` replays of a CUDA graph holding enough calls for ~rep_ms),
    as triton.testing.do_bench_cudagraph measures it, but captured on a stream of the tensors' device in
    thread-local capture mode. do_bench_cudagraph captured on torch.cuda.graph's default stream, created
    once per process on whichever device was current then: tuning for tensors on another GPU failed
    ("operation not permitted when stream is capturing"; seen on the 2-GPU H200), and its global capture
    mode broke launches from other threads while one thread tuned."""
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        fn()  # compiles (and loads) the kernel, outside the capture
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        end.synchronize()
        calls = max(1, min(1000, int(rep_ms / max(start.elapsed_time(end) / 5, 1e-3))))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            for _ in range(calls):
                fn()
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def _tune(a: torch.Tensor, b: torch.Tensor, allow_tf32: bool) -> tuple[MatmulConfig, float]:
    m, k = a.shape
    n = b.shape[1]
    best: tuple[MatmulConfig, float] | None = None
    for cfg in candidates(a.dtype, m, n, k, a.device):
        try:
            ms = graph_ms(lambda: matmul(a, b, cfg, allow_tf32), a.device)
        except triton.runtime.errors.OutOfResources:  # the estimate let through a config that fails
            continue
        if best is None or ms < best[1]:
            best = (cfg, ms)
    if best is None:
        raise RuntimeError(f"no matmul config runs on {a.device} for {m}x{k} @ {k}x{n} {a.dtype}")
    return best


# First calls from several threads: one tunes a key, the others wait for its choice (timing in parallel
# on one GPU would also rank candidates by each other's load)
_TUNE_LOCK = threading.Lock()


def select_config(a: torch.Tensor, b: torch.Tensor, allow_tf32: bool, autotune: bool) -> MatmulConfig:
    """The config C = A @ B runs with: pinned under the interpreter, else tuned (once per key: in this
    process, or in an earlier one through the disk cache, tuning_cache.py) or the untuned default."""
    if _KERNEL.interpreted:  # CPU tensors reach the kernel only under the interpreter
        return INTERPRETER_CONFIG
    m, k = a.shape
    n = b.shape[1]
    if not autotune:
        return default_config(a.dtype, m, n, k, a.device)
    key = tuning_key(a, b, allow_tf32)
    if key in _TUNED:
        return _TUNED[key][0]
    with _TUNE_LOCK:
        if key in _TUNED:  # tuned by another thread meanwhile
            return _TUNED[key][0]
        env = _environment(a.device)
        stored = disk_cache.load(env, key[1:], candidates(a.dtype, m, n, k, a.device))
        if stored is not None:
            _TUNED[key] = stored
        elif a.is_cuda and torch.cuda.is_current_stream_capturing():
            # first seen inside a CUDA graph capture: timing would synchronize and break the capture
            return default_config(a.dtype, m, n, k, a.device)
        else:
            _TUNED[key] = _tune(a, b, allow_tf32)
            disk_cache.store(env, key[1:], *_TUNED[key])
    return _TUNED[key][0]


@functools.cache
def _environment(device: torch.device) -> dict:
    return disk_cache.environment(device)


# ----------------------------------------------------------------------------------------------------
# The per-call path: a plan per exact call key. Choosing a config (tuning key, layout, shared-memory
# limits) costs ~7 us of Python per call on an H200 host; a dict lookup on the key costs ~1.
# ----------------------------------------------------------------------------------------------------
PLANS: dict[tuple, Plan] = {}


keep("matmul plans", lambda: (PLANS,))
keep("matmul tuned choices", lambda: (_TUNED,))  # this process's; the tuner's disk cache stays
keep("matmul bound kernels", lambda: (_KERNEL._compiled,))


def plan_key(a: torch.Tensor, b: torch.Tensor, block_sizes, autotune: bool, allow_tf32: bool) -> tuple:
    # everything a plan depends on: shapes, strides, dtype, device, 16-byte alignment (TMA), options
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device, a.data_ptr() % 16 == 0,
            b.data_ptr() % 16 == 0, block_sizes, autotune, allow_tf32)


def matmul_auto(a: torch.Tensor, b: torch.Tensor, block_sizes: tuple[int, int, int] | None, autotune: bool,
                allow_tf32: bool) -> torch.Tensor:
    """C = A @ B with the user's block sizes (validated: ValueError) or the selected config, planned once
    per call key."""
    key = plan_key(a, b, block_sizes, autotune, allow_tf32)
    p = PLANS.get(key)
    if p is None:
        m, k = a.shape
        n = b.shape[1]
        if block_sizes is not None:
            cfg = manual_config(*block_sizes, m, n, k, a.dtype, a.device)
        else:
            cfg = select_config(a, b, allow_tf32, autotune)
        p = plan(a, b, cfg)
        # not under a capture that could not tune: select_config's stand-in default is not the choice
        if not PLAIN and (block_sizes is not None or not autotune or a.device.type == "cpu"
                          or tuning_key(a, b, allow_tf32) in _TUNED):
            remember(PLANS, key, p)
    return run(a, b, p, allow_tf32)
