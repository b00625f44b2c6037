"""Tile configurations for the attention kernels, in one place.

A config is chosen per (head_dim, dtype) from a small table measured on an H200
(bench/attention_configs.py sweeps the candidates below and prints the winners), then pruned to what
fits the device's shared memory. Under Triton's interpreter one small config is pinned: autotuning
needs a GPU, and 32-wide tiles keep the multi-block paths exercised by tiny test shapes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class AttnConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


INTERPRETER_CONFIG = AttnConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)

# Candidates the sweep tries (bench/attention_configs.py); the tables below pick from these.
FWD_CANDIDATES = [
    AttnConfig(bm, bn, w, s)
    for bm in (64, 128)
    for bn in (32, 64, 128)
    for w in (4, 8)
    for s in (2, 3, 4)
]
BWD_CANDIDATES = [
    AttnConfig(bm, bn, w, s)
    for bm, bn in ((32, 64), (32, 128), (64, 64), (64, 128), (128, 64))
    for w in (4, 8)
    for s in (2, 3)
]

# Forward, fp16/bf16, keyed by padded head_dim. Winners of bench/attention_configs.py on an H200
# (torch 2.11, Triton 3.6, fp16, N = 4096, 2026-11-21), non-causal TFLOPS of the winner / runner-up:
# d64 371 (128x64 w4 s3) / 366; d128 474 (128x64 w8 s4) / 445; d256 436 (128x32 w8 s4) / 434.
_FWD_HALF = {
    16: AttnConfig(128, 64, 4, 3),
    32: AttnConfig(128, 64, 4, 3),
    64: AttnConfig(128, 64, 4, 3),
    128: AttnConfig(128, 64, 8, 4),
    256: AttnConfig(128, 32, 8, 4),
}
# Backward (the dk/dv and the dq kernel share these tiles), same sweep, non-causal / causal TFLOPS:
# d64 333 / 310 (64x64 w4 s3); d128 301 / 288 (64x64 w4 s2); d256 175 (64x64 w8 s2).
_BWD_HALF = {
    16: AttnConfig(64, 64, 4, 3),
    32: AttnConfig(64, 64, 4, 3),
    64: AttnConfig(64, 64, 4, 3),
    128: AttnConfig(64, 64, 4, 2),
    256: AttnConfig(64, 64, 8, 2),
}
# fp32 is computed with IEEE fp32 dots (no TF32): twice the bytes per tile, no tensor cores.
_FWD_FP32 = AttnConfig(64, 32, 4, 2)
_BWD_FP32 = AttnConfig(32, 32, 4, 2)


def smem_bytes_fwd(cfg: AttnConfig, head_dim_pad: int, elem: int) -> int:
    """Shared memory a forward program needs: the q tile plus num_stages buffered k and v tiles.
    (Matches Triton 3.6's own count on H200: 128x128 tiles, d=128, 4 stages -> 294912 bytes.)"""
    return elem * head_dim_pad * (cfg.block_m + 2 * cfg.block_n * cfg.num_stages)


def smem_bytes_bwd(cfg: AttnConfig, head_dim_pad: int, elem: int) -> int:
    """Shared memory of the larger backward program (dk/dv): k, v resident, q and dout pipelined."""
    resident = 2 * cfg.block_n * head_dim_pad
    streamed = 2 * cfg.block_m * head_dim_pad * cfg.num_stages
    return elem * (resident + streamed) + 4 * cfg.block_m * cfg.block_n


def _fit(cfg: AttnConfig, head_dim_pad: int, elem: int, smem_limit: int | None, cost) -> AttnConfig:
    """Drop pipeline stages until the estimate fits the device's shared memory."""
    if smem_limit is None:
        return cfg
    while cfg.num_stages > 1 and cost(cfg, head_dim_pad, elem) > smem_limit:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


@functools.cache
def _smem_limit(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", None)


# Cached: a config lookup runs on every call, and the device-properties query costs microseconds.
@functools.cache
def fwd_config(head_dim_pad: int, dtype: torch.dtype, device: torch.device, interpret: bool) -> AttnConfig:
    if interpret:
        return INTERPRETER_CONFIG
    cfg = _FWD_FP32 if dtype == torch.float32 else _FWD_HALF[head_dim_pad]
    return _fit(cfg, head_dim_pad, dtype.itemsize, _smem_limit(device), smem_bytes_fwd)


@functools.cache
def bwd_config(head_dim_pad: int, dtype: torch.dtype, device: torch.device, interpret: bool) -> AttnConfig:
    if interpret:
        return INTERPRETER_CONFIG
    cfg = _BWD_FP32 if dtype == torch.float32 else _BWD_HALF[head_dim_pad]
    return _fit(cfg, head_dim_pad, dtype.itemsize, _smem_limit(device), smem_bytes_bwd)
