"""Tile configurations for the attention kernels, in one place.

Each kernel (forward, backward dk/dv, backward dq) takes its tiles per (padded head_dim, causal) from
attention_tuned.py, which one command writes (`python -m bench.attention_configs --write`: it times
the candidates below on the GPU and records the winners with the device and versions). An entry may
hold tiles per length bucket (`--bucket`): {2048: tiles, None: tiles} serves sequences up to 2048 keys
or queries with the first and longer ones with the second. A split dk/dv backward (two passes) may
also have tiles for its dv pass alone ('dv' entries; without one, both passes use the dk/dv tiles).
fp16 and bf16 share the table; fp32 has fixed small tiles. The chosen tiles are pruned to what fits
the device's shared memory. Under Triton's interpreter one small config is pinned: autotuning needs a
GPU, and 32-wide tiles keep the multi-block paths exercised by tiny test shapes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from ._runtime import device_limits
from .attention_tuned import TUNED


def head_dim_pad(head_dim: int) -> int:
    """Tile width along head_dim, and the tables' key: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, 1 << (head_dim - 1).bit_length())


MAX_BLOCK_ROWS = 256  # the most rows a tile may have: the kernels' 32-bit row offsets count on it (rows_fit_int32)
# Warp-specialized main loops (ws) run with 8 warps only. With 4, Triton 3.6's warp-specialization pass
# fails on some of these kernels (NVGPUWarpSpecialization, a dominance assertion) and compiles the D128
# forward (128x64 w4 s2 tma) into a kernel whose output is wrong by up to 0.47 (H200).
WS_WARPS = 8


@dataclass(frozen=True)
class AttnConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int
    num_stages: int
    # dk/dv kernel only: two passes, dv then dk, each holding one (block_n, head_dim) fp32 accumulator
    # instead of two. One more q.k^T dot per tile, but large head_dims stop spilling registers.
    split: bool = False
    # read the streamed tiles through TMA tensor descriptors (Hopper and newer) when the inputs allow
    # it (kernels.attention.tma_ok); other inputs run the pointer path with the same tiles. The forward
    # builds its descriptors on the host where it can (kernels.attention.host_descriptor)
    tma: bool = False
    # warp-specialize the unmasked main loop (Triton's automatic warp specialization: the loads, the
    # dots and the softmax in separate warps, which adds warps to the program); only with tma
    ws: bool = False
    # pointer loads only: address each streamed block as the first tile plus a row offset (start * row
    # stride; 32-bit where kernels.attention.rows_fit_int32 allows, else 64-bit) instead of advancing
    # the pointer tiles. The same loads and math (results are bitwise the same); ptxas schedules the
    # loop differently, and which way is faster depends on the tiles: on the H200 (Triton 3.6,
    # bench/results/attention_tiles_probe_h200.txt) 64-bit offsets gained 2-16 % with 4 warps and
    # moved -7..+2.5 % with 8; 32-bit offsets take the D64 forward's 8-warp loop from 282 to 272 SASS
    # instructions, +1..3 %. Called off64 in older results files.
    rowoff: bool = False
    # rowoff tiles only: keep the row offsets 64-bit even where they fit in 32 bits. The same addresses
    # again, and ptxas schedules 4-warp loops better with the wider adds: on the H200 (Triton 3.6,
    # bench/results/attention_tiles_probe_h200.txt) +3 % for the D128 causal forward at 64x64 w4
    # s3 and +1..5 % for the D64 backward's 4-warp tiles, against -5 % at 128x64 w8 (forward, D128)
    row64: bool = False
    # forward only: lazy rescaling (kernels.attention, LAZY_SLACK): a row's running max moves only when a
    # key block's max passes it by more than 2^8, and a warp whose rows all kept theirs skips rescaling
    # its accumulator (a branch around one multiply per accumulator element and key block)
    lazy: bool = False

    FLAGS = ("split", "tma", "ws", "rowoff", "row64", "lazy")  # the boolean fields, recorded by name in attention_tuned.py

    def __post_init__(self):
        if not (0 < self.block_m <= MAX_BLOCK_ROWS and 0 < self.block_n <= MAX_BLOCK_ROWS):
            raise ValueError(f"{self}: block_m and block_n must be in 1..{MAX_BLOCK_ROWS}")
        if self.ws and not self.tma:
            raise ValueError(f"{self}: ws (warp-specialized loops) needs tma (TMA loads)")
        if self.ws and self.num_warps != WS_WARPS:
            raise ValueError(f"{self}: ws (warp-specialized loops) runs with num_warps={WS_WARPS} only; "
                             f"Triton miscompiles it with {self.num_warps}")
        if self.rowoff and self.tma:
            raise ValueError(f"{self}: rowoff addresses pointer loads; tma tiles have none")
        if self.lazy and self.ws:
            raise ValueError(f"{self}: lazy (rescaling) votes across a warp's rows, which warp-specialized loops "
                             "(ws) split over other warps")
        if self.row64 and not self.rowoff:
            raise ValueError(f"{self}: row64 (64-bit row offsets) needs rowoff (row-offset addressing)")

    @property
    def stacked_rows(self) -> int:
        """Rows of a (block_m, head_dim) accumulator each thread holds where the program's warps stack
        along the rows (block_m a multiple of 16 * num_warps; on Hopper 16 rows a warp, 2 of them a thread
        per m64 tile: block_m / (8 * num_warps)), else 0. Lazy rescaling votes over them
        (kernels.attention.vote_rows)."""
        if self.block_m % (16 * self.num_warps):
            return 0
        return self.block_m // (8 * self.num_warps)

    @classmethod
    def from_tiles(cls, tiles: tuple) -> AttnConfig:
        """(block_m, block_n, num_warps, num_stages, *flags) as attention_tuned.py records it, flags by
        name: (32, 128, 8, 2, "split", "tma")."""
        ints, flags = tiles[:4], tiles[4:]
        unknown = set(flags) - set(cls.FLAGS)
        if unknown:
            raise ValueError(f"unknown tile flags {sorted(unknown)}; known: {cls.FLAGS}")
        return cls(*ints, **{flag: True for flag in flags})

    def as_tiles(self) -> tuple:
        return (self.block_m, self.block_n, self.num_warps, self.num_stages,
                *(flag for flag in self.FLAGS if getattr(self, flag)))

    def as_dict(self) -> dict:
        d = {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }
        d.update({flag: True for flag in self.FLAGS if getattr(self, flag)})
        return d


INTERPRETER_CONFIG = AttnConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)

# Candidates the sweep tries (bench/attention_configs.py). The forward tiles queries (block_m) and streams
# keys (block_n); the dk/dv kernel keeps a key block (block_n) and streams queries (block_m); the dq
# kernel keeps a query block and streams keys. Each kernel is tuned on its own.
FWD_CANDIDATES = [
    AttnConfig(bm, bn, w, s)
    for bm in (64, 128)
    for bn in (32, 64, 128)
    for w in (4, 8)
    for s in (3, 4, 5)
] + [AttnConfig(bm, bn, 4, 7) for bm, bn in ((64, 64), (128, 32), (128, 64))]  # deep pipelines, small tiles
# the same pointer tiles with row-offset addressing (rowoff), and with 4 warps its 64-bit form (row64)
FWD_CANDIDATES += [replace(c, rowoff=True) for c in FWD_CANDIDATES]
FWD_CANDIDATES += [replace(c, row64=True) for c in FWD_CANDIDATES if c.rowoff and c.num_warps == 4]
# TMA loads take no registers for addresses: a shallower pipeline (2 stages) can pay there
FWD_CANDIDATES += [
    AttnConfig(bm, bn, w, s, tma=True)
    for bm in (64, 128)
    for bn in (32, 64, 128)
    for w in (4, 8)
    for s in (2, 3, 4)
]
DKDV_CANDIDATES = [
    AttnConfig(bm, bn, w, s)
    for bm, bn in ((32, 32), (64, 32), (128, 32), (32, 64), (32, 128), (64, 64), (64, 128), (128, 64), (128, 128))
    for w in (4, 8)
    for s in (2, 3, 4)
] + [  # split passes: one accumulator each, so wider key blocks fit at head_dim 256
    AttnConfig(bm, bn, w, s, split=True)
    for bm, bn, w in ((32, 64, 4), (64, 64, 4), (32, 128, 8), (64, 128, 8), (128, 128, 8))
    for s in (2, 3)
]
DQ_CANDIDATES = [
    AttnConfig(bm, bn, w, s)
    for bm, bn in ((64, 32), (64, 64), (128, 32), (64, 128), (128, 64), (128, 128))
    for w in (4, 8)
    for s in (2, 3, 4)
]
# the seed tutorial's backward tiles (dk/dv 32x128, dq 128x32, 4 warps, 5 stages), which it runs at D64
DKDV_CANDIDATES.append(AttnConfig(32, 128, 4, 5))
DQ_CANDIDATES.append(AttnConfig(128, 32, 4, 5))
# The dv pass of a split dk/dv backward, tiled on its own (BwdConfig.dv): it holds k but not v, and
# one accumulator, so deeper pipelines and two programs per SM fit where the dk pass's tiles do not.
DV_CANDIDATES = [
    AttnConfig(bm, bn, w, s)
    for bm, bn, w in ((16, 64, 4), (32, 64, 4), (64, 64, 4), (32, 128, 8), (64, 128, 8))
    for s in (2, 3, 4, 5)
]
# Warp-specialized main loops (TMA only, WS_WARPS): 128-row forward tiles, as Triton's tutorial runs its
# Hopper path, and the backward's 8-warp TMA tiles.
FWD_CANDIDATES += [AttnConfig(128, bn, WS_WARPS, s, tma=True, ws=True) for bn in (64, 128) for s in (2, 3)]
# Lazy rescaling (forward only): the twin of every tile whose warps stack along the rows, where a warp can
# vote on its rows' maxima (kernels.attention.vote_rows); not with ws
FWD_CANDIDATES += [replace(c, lazy=True) for c in FWD_CANDIDATES if not c.ws and c.stacked_rows]
# Each backward kernel's pointer tiles get their flagged twins, in this order: rowoff (with 64-bit offsets
# it only paid with 4 warps; with 32-bit ones the D64 8-warp dq tiles gain 3 %), row64 for the 4-warp
# rowoff ones, TMA for the pointer-advancing ones, then ws for the 8-warp TMA ones.
for _cands in (DKDV_CANDIDATES, DQ_CANDIDATES, DV_CANDIDATES):
    _cands += [replace(c, rowoff=True) for c in _cands]
    _cands += [replace(c, row64=True) for c in _cands if c.rowoff and c.num_warps == 4]
    _cands += [replace(c, tma=True) for c in _cands if not c.rowoff]
    _cands += [replace(c, ws=True) for c in _cands if c.tma and c.num_warps == WS_WARPS]
del _cands
CANDIDATES = {"fwd": FWD_CANDIDATES, "dkdv": DKDV_CANDIDATES, "dq": DQ_CANDIDATES, "dv": DV_CANDIDATES}

# fp32 is computed with IEEE fp32 dots (no TF32): twice the bytes per tile, no tensor cores.
_FP32 = {"fwd": AttnConfig(64, 32, 4, 2), "dkdv": AttnConfig(32, 32, 4, 2), "dq": AttnConfig(32, 32, 4, 2)}


class BwdConfig(NamedTuple):
    """The backward's two main kernels, tiled independently; where dkdv is split, its dv pass may have
    tiles of its own (dv; None: the dkdv tiles)."""

    dkdv: AttnConfig
    dq: AttnConfig
    dv: AttnConfig | None = None

    @property
    def dv_pass(self) -> AttnConfig | None:
        """The tiles of the dv pass, or None where dk and dv are one pass."""
        if not self.dkdv.split:
            return None
        return self.dv or replace(self.dkdv, split=False)

    def dkdv_passes(self) -> tuple[tuple[AttnConfig, bool, bool], ...]:
        """(tiles, does dk, does dv) of each launch of the dk/dv kernel: one pass for both, or (split)
        a dv pass, then a dk pass."""
        dv_pass = self.dv_pass
        if dv_pass is None:
            return ((self.dkdv, True, True),)
        return ((dv_pass, False, True), (self.dkdv, True, False))

    def kernels(self) -> tuple[AttnConfig, ...]:
        """The tiles of every launch: the dk/dv pass(es), then dq."""
        return (*(tiles for tiles, _, _ in self.dkdv_passes()), self.dq)

    def as_dict(self) -> dict:
        d = {"dkdv": self.dkdv.as_dict(), "dq": self.dq.as_dict()}
        if self.dv is not None:
            d["dv"] = self.dv.as_dict()
        return d


def smem_bytes_fwd(cfg: AttnConfig, head_dim_pad: int, elem: int) -> int:
    """Shared memory a forward program needs: the q tile plus num_stages buffered k and v tiles.
    (Matches Triton 3.6's own count on H200: 128x128 tiles, d=128, 4 stages -> 294912 bytes.)"""
    return elem * head_dim_pad * (cfg.block_m + 2 * cfg.block_n * cfg.num_stages)


def smem_bytes_dkdv(cfg: AttnConfig, head_dim_pad: int, elem: int) -> int:
    """Shared memory of a dk/dv program: k, v resident, q and dout pipelined, a p/ds tile staged.
    (A split pass holds k, and v only for dk: the larger of the two passes is counted.)"""
    resident = 2 * cfg.block_n * head_dim_pad
    streamed = 2 * cfg.block_m * head_dim_pad * cfg.num_stages
    return elem * (resident + streamed) + 4 * cfg.block_m * cfg.block_n


def smem_bytes_dq(cfg: AttnConfig, head_dim_pad: int, elem: int) -> int:
    """Shared memory of a dq program: q, dout resident, k and v pipelined, a ds tile staged."""
    resident = 2 * cfg.block_m * head_dim_pad
    streamed = 2 * cfg.block_n * head_dim_pad * cfg.num_stages
    return elem * (resident + streamed) + 4 * cfg.block_m * cfg.block_n


def smem_bytes_dv(cfg: AttnConfig, head_dim_pad: int, elem: int) -> int:
    """Shared memory of a dv pass: k resident, q and dout pipelined, a p tile staged."""
    streamed = 2 * cfg.block_m * head_dim_pad * cfg.num_stages
    return elem * (cfg.block_n * head_dim_pad + streamed) + 4 * cfg.block_m * cfg.block_n


SMEM_BYTES = {"fwd": smem_bytes_fwd, "dkdv": smem_bytes_dkdv, "dq": smem_bytes_dq, "dv": smem_bytes_dv}


def _fit(cfg: AttnConfig, head_dim_pad: int, elem: int, smem_limit: int | None, cost) -> AttnConfig:
    """Drop pipeline stages until the estimate fits the device's shared memory."""
    if smem_limit is None:
        return cfg
    while cfg.num_stages > 1 and cost(cfg, head_dim_pad, elem) > smem_limit:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def tiles_for(entry, seq_len: int | None) -> tuple:
    """The tiles of an attention_tuned.py entry for sequences of `seq_len` (the longer of queries and
    keys): the entry itself, or from {max_len: tiles, ..., None: tiles} the smallest bucket holding
    seq_len, else the None bucket (longer sequences, or length not given)."""
    if isinstance(entry, tuple):
        return entry
    if seq_len is not None:
        fits = [n for n in entry if n is not None and seq_len <= n]
        if fits:
            return entry[min(fits)]
    return entry[None]


def _config(kind: str, head_dim_pad: int, dtype: torch.dtype, device: torch.device, causal: bool,
            interpret: bool, seq_len: int | None) -> AttnConfig:
    if interpret:
        return INTERPRETER_CONFIG
    if dtype == torch.float32:
        cfg = _FP32[kind]
    else:  # attention_tuned.py covers every padded head_dim (tests/test_bench.py checks it)
        cfg = AttnConfig.from_tiles(tiles_for(TUNED[kind]["causal" if causal else "plain"][head_dim_pad], seq_len))
    return _fit(cfg, head_dim_pad, dtype.itemsize, device_limits(device).smem, SMEM_BYTES[kind])


def _dv_config(dkdv: AttnConfig, head_dim_pad: int, dtype: torch.dtype, device: torch.device, causal: bool,
               seq_len: int | None) -> AttnConfig | None:
    """The dv pass's own tiles: where dkdv is split and attention_tuned.py has a 'dv' entry for them."""
    if not dkdv.split or head_dim_pad not in TUNED.get("dv", {}).get("causal" if causal else "plain", {}):
        return None
    return _config("dv", head_dim_pad, dtype, device, causal, False, seq_len)


# Forward tiles for a sliding window, where they differ from the causal ones. A band keeps every query
# block on about the same number of key blocks, so the causal table's choice (short tiles for short
# diagonal blocks) does not carry over: the window_probe probe, H100, B1 H16 N16384 D128 fp16, window
# 4096 (results/window_probe_h100.txt): the causal tiles (128x64 w4 s2 tma lazy) 389 TFLOPS of visible
# work, 128x128 w8 s3 tma lazy 455. Only D128 was measured; other head_dims keep the causal tiles.
WINDOW_FWD = {128: AttnConfig(128, 128, 8, 3, tma=True, lazy=True)}


def window_fwd_config(head_dim_pad: int, dtype: torch.dtype, device: torch.device, interpret: bool,
                      seq_len: int | None = None) -> AttnConfig:
    if interpret or dtype == torch.float32 or head_dim_pad not in WINDOW_FWD:
        return fwd_config(head_dim_pad, dtype, device, True, interpret, seq_len)
    return _fit(WINDOW_FWD[head_dim_pad], head_dim_pad, dtype.itemsize, device_limits(device).smem, SMEM_BYTES["fwd"])


# Cached: the launchers ask on every call they have no plan for, and the device query costs microseconds.
# Bounded: one entry per sequence length seen.
@functools.lru_cache(maxsize=4096)
def fwd_config(head_dim_pad: int, dtype: torch.dtype, device: torch.device, causal: bool,
               interpret: bool, seq_len: int | None = None) -> AttnConfig:
    return _config("fwd", head_dim_pad, dtype, device, causal, interpret, seq_len)


@functools.lru_cache(maxsize=4096)
def bwd_config(head_dim_pad: int, dtype: torch.dtype, device: torch.device, causal: bool,
               interpret: bool, seq_len: int | None = None) -> BwdConfig:
    dkdv = _config("dkdv", head_dim_pad, dtype, device, causal, interpret, seq_len)
    return BwdConfig(dkdv, _config("dq", head_dim_pad, dtype, device, causal, interpret, seq_len),
                     _dv_config(dkdv, head_dim_pad, dtype, device, causal, seq_len))
