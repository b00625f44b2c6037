"""What every attention launcher (launch.py, kvcache.py) derives from a call the same way: the dtype
switches, the v tiles' width, the ALiBi stride and the variant's meta-parameters (the variant itself is
kernels/contract.py's)."""

from __future__ import annotations

import torch

from .._launch import compiled
from ..attention_configs import head_dim_pad
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

