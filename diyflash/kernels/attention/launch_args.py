"""What every attention launcher (launch.py, kvcache.py) derives from a call the same way: the variant
as the kernels take it, the dtype switches, the v tiles' width and the ALiBi stride."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._launch import compiled
from ..attention_configs import head_dim_pad
from ..attention_torch import band
from .semantics import _valid_lengths

INTERPRETED = not compiled(_valid_lengths)  # fixed when the kernels were decorated, as Triton decides it


LOG2E = 1.4426950408889634  # 1 / ln(2): exp(x) == exp2(x * LOG2E)


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must stay fp32-accurate: no TF32. fp16/bf16 ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def upcast(dtype: torch.dtype) -> bool:
    # the interpreter's bf16 tl.dot is wrong (triton-lang/triton#11584): widen the tiles there
    return dtype == torch.bfloat16 and INTERPRETED


class Variant(NamedTuple):
    """A call's variant arguments as the kernels take them (semantics.py): `causal` after folding a
    non-causal window with right edge 0 into it; `window` a bounded band (the unbounded side passed as
    N_q + N_k, right capped at 0 under causal); cap2 = softcap * log2(e); GQA's query heads per kv head."""

    causal: bool
    window: bool
    left: int
    right: int
    cap2: float
    kv_group: int

    @property
    def softcap(self) -> bool:
        return self.cap2 > 0


def variant(causal: bool, window: tuple[int, int], softcap: float, n_q: int, n_k: int, h: int, h_kv: int) -> Variant:
    causal, bounded, left, right = band(causal, window, n_q, n_k)
    return Variant(causal, bounded, left, right, softcap * LOG2E, h // h_kv)


def variant_meta(var: Variant, alibi: torch.Tensor | None) -> dict:
    return dict(WINDOW=var.window, SOFTCAP=var.softcap, ALIBI=alibi is not None)


def v_pad(d: int, dv: int) -> int:
    """The v tiles' width. A 16-wide v beside wider q/k tiles is widened to 32: Triton 3.6 compiled the
    forward with D 24 / D_v 8 (tiles 32 / 16, 128x64, 3 stages) into a kernel that read shared memory out
    of bounds (compute-sanitizer, H100: 'Invalid __shared__ read' at the p @ v dot), and
    crashed on some calls."""
    dv_pad = head_dim_pad(dv)
    return max(dv_pad, 32) if dv_pad < head_dim_pad(d) else dv_pad


def alibi_stride(alibi: torch.Tensor | None) -> int:
    # (H,) slopes: the same row for every batch; (B, H): row z
    return 0 if alibi is None or alibi.dim() == 1 else alibi.stride(0)


DECODE_MAX_ROWS = 64  # the decode kernel's largest row tile (kvcache.decode_rows), also decode_route's bound
