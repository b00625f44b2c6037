"""What every attention launcher (launch.py, launch_bwd.py, kvcache.py) derives from a call the same way: the dtype
switches, the v tiles' width, the ALiBi stride and the variant's meta-parameters (the variant itself is
kernels/contract.py's)."""

from __future__ import annotations

import torch

from .._launch import compiled
from ..attention_configs import AttnConfig, head_dim_pad
from ..contract import Variant
from .semantics import _valid_lengths

INTERPRETED = not compiled(_valid_lengths)  # fixed when the kernels were decorated, as Triton decides it


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must stay fp32-accurate: no TF32. fp16/bf16 ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def upcast(dtype: torch.dtype) -> bool:
    # the interpreter's bf16 tl.dot is wrong (triton-lang/triton#11584): widen the tiles there
    return dtype == torch.bfloat16 and INTERPRETED


def variant_meta(var: Variant, alibi: torch.Tensor | None) -> dict:
    return dict(WINDOW=var.window, SOFTCAP=var.softcap, ALIBI=alibi is not None)


def v_pad(d: int, dv: int) -> int:
    """The v tiles' width: Dv padded, and no narrower than min(padded D, 64) beside wider q/k tiles.
    Triton 3.6 compiled the two-pass (bf16) causal forward with a 16- or 32-wide v tile beside 64..256-wide
    q/k tiles into kernels that read shared memory out of bounds (compute-sanitizer on the H200: D 64..256
    with Dv 16/32, with and without TMA or lazy rescaling; clean with the v tile widened to 64, forward and
    backward: bench/results/narrow_v_h200.jsonl) and hit illegal addresses on some calls. Beside 32-wide q/k
    tiles a 16-wide v is widened to 32 (D 24 / Dv 8 had read out of bounds on the H100 at the p @ v dot)."""
    return max(head_dim_pad(dv), min(head_dim_pad(d), 64))


def alibi_stride(alibi: torch.Tensor | None) -> int:
    # (H,) slopes: the same row for every batch; (B, H): row z
    return 0 if alibi is None or alibi.dim() == 1 else alibi.stride(0)


def tile_meta(cfg: AttnConfig, tma: bool, seq_lens: torch.Tensor | None, n_q: int, n_k: int, row32: bool) -> dict:
    """A kernel's launch options from its tiles: blocks, warps, stages, TMA (where the inputs allow it,
    `tma`), warp specialization (with TMA only) and EVEN_M / EVEN_N: every query / key block of these
    tiles is full, so rows and keys need no masks (never with seq_lens, whose valid lengths are only
    known on the device); ROWOFF (the tiles' rowoff) and ROW32 (`row32`: rows_fit_int32 of the launch's
    tensors, so row offsets are computed in 32 bits, unless the tiles ask for 64: row64)."""
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                TMA=tma, WS=tma and cfg.ws, ROWOFF=cfg.rowoff, ROW32=row32 and not cfg.row64,
                EVEN_M=seq_lens is None and n_q % cfg.block_m == 0,
                EVEN_N=seq_lens is None and n_k % cfg.block_n == 0)
