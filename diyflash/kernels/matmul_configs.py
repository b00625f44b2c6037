"""Matmul tile configurations in one place: candidates, shape buckets, shared-memory pruning, the
validation of user-given block sizes, and which operand layouts can use tensor descriptors (TMA).

The autotuner itself (timing candidates once per key and caching the winner) is in matmul.py, next
to the launcher it times. The key is (device, dtype, tf32, operand layout, bucket(M), bucket(N),
bucket(K)) with bucket = next power of two, so a model with many slightly different token counts
tunes once per bucket, not once per shape.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ._runtime import device_limits

SUPPORTED_BLOCK_MN = (16, 32, 64, 128, 256)
SUPPORTED_BLOCK_K = (16, 32, 64, 128)


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    use_tma: bool = True  # when the operands' layout allows it; pointer loads otherwise
    persistent: bool = False
    programs_per_sm: int = 1

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# Interpreter (CPU CI): one small pinned config; the persistent loop runs with 4 programs.
INTERPRETER_CONFIG = MatmulConfig(32, 32, 32, group_m=2, num_warps=4, num_stages=1, use_tma=True, persistent=True)

# fp16/bf16 candidates for Hopper-class GPUs (the tuner times those that fit shared memory).
HALF_CANDIDATES = [
    MatmulConfig(128, 256, 64, num_warps=8, num_stages=3, persistent=True),
    MatmulConfig(128, 256, 64, num_warps=8, num_stages=3),
    MatmulConfig(256, 128, 64, num_warps=8, num_stages=3, persistent=True),
    MatmulConfig(256, 128, 64, num_warps=8, num_stages=3),
    MatmulConfig(128, 128, 64, num_warps=8, num_stages=4, persistent=True),
    MatmulConfig(128, 128, 64, num_warps=4, num_stages=4),
    MatmulConfig(128, 128, 64, num_warps=8, num_stages=4),
    MatmulConfig(64, 128, 64, num_warps=4, num_stages=4),
    MatmulConfig(128, 64, 64, num_warps=4, num_stages=4),
    MatmulConfig(64, 64, 64, num_warps=4, num_stages=4),
]
# Small problems: TMA buys less there, and on some GPU hosts the three descriptors cost measurable host
# time per launch (bench/overhead.py: 5-23 us on H200 hosts). Pointer-load twins of the small tiles
# let the tuner pick whichever runs faster.
SMALL_POINTER_TWINS = [replace(c, use_tma=False) for c in HALF_CANDIDATES if c.block_m * c.block_n <= 128 * 256]
SMALL_PROBLEM_FLOPS = 2 * 2048**3  # up to here the twins are tried

# fp32 is computed with IEEE fp32 FMAs by default (no tensor cores): smaller tiles.
FP32_CANDIDATES = [
    MatmulConfig(128, 128, 32, num_warps=8, num_stages=3),
    MatmulConfig(64, 128, 32, num_warps=4, num_stages=3),
    MatmulConfig(128, 64, 32, num_warps=4, num_stages=3),
    MatmulConfig(64, 64, 32, num_warps=4, num_stages=3),
]


def bucket(x: int) -> int:
    """Shape bucket: the next power of two (at least 16)."""
    return max(16, 1 << max(x - 1, 0).bit_length())


def smem_bytes(cfg: MatmulConfig, elem: int) -> int:
    """num_stages buffered A and B tiles, plus the C tile staged for a TMA store."""
    operands = cfg.num_stages * (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n) * elem
    epilogue = cfg.block_m * cfg.block_n * elem if cfg.use_tma else 0
    return operands + epilogue


def fits(cfg: MatmulConfig, elem: int, limit: int | None) -> MatmulConfig | None:
    """The config with as many of its stages as fit shared memory, or None."""
    if limit is None:
        return cfg
    while smem_bytes(cfg, elem) > limit:
        if cfg.num_stages == 1:
            return None
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def candidates(dtype: torch.dtype, m: int, n: int, k: int, device: torch.device) -> list[MatmulConfig]:
    """Candidates for this problem: fitting shared memory, tiles no larger than the padded problem."""
    limits = device_limits(device)
    limit, has_tma = limits.smem, limits.tma
    pool = FP32_CANDIDATES if dtype == torch.float32 else HALF_CANDIDATES
    if dtype != torch.float32 and 2 * m * n * k <= SMALL_PROBLEM_FLOPS:
        pool = pool + SMALL_POINTER_TWINS
    out = []
    for cfg in pool:
        if not has_tma:
            cfg = replace(cfg, use_tma=False)
        if cfg.block_m > bucket(m) * 2 or cfg.block_n > bucket(n) * 2:
            continue  # mostly padding: a smaller tile is always better
        cfg = fits(cfg, dtype.itemsize, limit)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out or [fits(MatmulConfig(64, 64, 32, num_stages=2, use_tma=has_tma), dtype.itemsize, limit)]


def default_config(dtype: torch.dtype, m: int, n: int, k: int, device: torch.device) -> MatmulConfig:
    """The untuned choice (use_autotune=False): the largest candidate tile that the problem fills."""
    pool = candidates(dtype, m, n, k, device)
    filled = [c for c in pool if c.block_m <= bucket(m) and c.block_n <= bucket(n)]
    return (filled or pool)[0]


def manual_config(block_m, block_n, block_k, m: int, n: int, k: int, dtype: torch.dtype,
                  device: torch.device) -> MatmulConfig:
    """Validate user-given block sizes (all three or none) and build their config, else ValueError."""
    given = {"block_m": block_m, "block_n": block_n, "block_k": block_k}
    missing = [name for name, v in given.items() if v is None]
    if missing:
        raise ValueError(f"block sizes must be given all three or none, got {given} (missing {', '.join(missing)})")
    for name, v in given.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v & (v - 1):
            raise ValueError(f"{name} must be a positive power of two, got {v!r}")
    for name, v, allowed in (("block_m", block_m, SUPPORTED_BLOCK_MN), ("block_n", block_n, SUPPORTED_BLOCK_MN),
                             ("block_k", block_k, SUPPORTED_BLOCK_K)):
        if v not in allowed:
            raise ValueError(f"{name}={v} is not supported by the kernel: choose one of {allowed}")
    for name, v, dim, size in (("block_m", block_m, "M", m), ("block_n", block_n, "N", n), ("block_k", block_k, "K", k)):
        if v > bucket(size):
            raise ValueError(f"{name}={v} exceeds the padded problem: {dim}={size} pads to {bucket(size)}")
    limits = device_limits(device)
    limit, has_tma = limits.smem, limits.tma
    warps = 8 if block_m * block_n >= 128 * 256 else 4
    cfg = fits(MatmulConfig(block_m, block_n, block_k, num_warps=warps, num_stages=4, use_tma=has_tma),
               dtype.itemsize, limit)
    if cfg is None:
        raise ValueError(f"block sizes {block_m}x{block_n}x{block_k} do not fit the GPU's shared memory ({limit} bytes)")
    return cfg


def _tma_orientation(t: torch.Tensor) -> bool | None:
    """False: t can be described row-major; True: its transpose can; None: neither (pointer loads)."""
    elem = t.element_size()
    if t.data_ptr() % 16:
        return None
    s0, s1 = t.stride()
    if s1 == 1 and s0 > 0 and (s0 * elem) % 16 == 0:
        return False
    if s0 == 1 and s1 > 0 and (s1 * elem) % 16 == 0:
        return True
    return None


def tma_layout(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, bool] | None:
    """(a_trans, b_trans) when A, B and the contiguous (M, N) output can all go through tensor
    descriptors, else None (pointer loads)."""
    if a.dtype == torch.float32 and a.device.type == "cuda":
        return None  # IEEE fp32 dots run on FMAs: TMA buys nothing there
    n = b.shape[1]
    if (n * a.element_size()) % 16:
        return None  # C's rows would not be 16-byte aligned
    a_t, b_t = _tma_orientation(a), _tma_orientation(b)
    if a_t is None or b_t is None:
        return None
    return a_t, b_t
