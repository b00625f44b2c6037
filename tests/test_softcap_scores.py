"""The softcap's scores as every kernel computes them (semantics._scores with SOFTCAP: the scale and tanh's own
factor folded into one multiply of the raw dot, tanh by exp2 and a reciprocal, a polynomial near 0) against
float64, across the whole range: scores from 1e-30 to past saturation, both sides of the polynomial's bound, and
softcaps from 1e-3 to the largest accepted one, where the tanh argument is subnormal (a flush of it once made every
score 0 on the GPU). On CPU the helpers run in Triton's interpreter (exact division, no flushes); on CUDA
compiled, with rcp.approx, ex2.approx and mul.rn.
"""

import math

import numpy as np
import pytest
import torch

from diyflash.kernels import contract
from diyflash.ops import rules

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from diyflash.kernels.attention import semantics  # noqa: E402


@triton.jit
def _capped_scores(qk_ptr, s_ptr, t_ptr, n, qk_scale, cap2, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    qk = tl.load(qk_ptr + offs, mask=mask, other=0.0)
    inv_cap2 = semantics._inv(cap2, SOFTCAP=True)
    s, t = semantics._scores(qk, 0, 0, 0, qk_scale, cap2, inv_cap2, 0.0, SOFTCAP=True, ALIBI=False)
    tl.store(s_ptr + offs, s, mask=mask)
    tl.store(t_ptr + offs, t, mask=mask)


def _raw_dots(cap2: float, qk_scale: float) -> np.ndarray:
    """Raw dots whose scaled scores span 1e-30 to 1e30 (finite in fp32) and straddle the polynomial's bound,
    |s / cap2| = 0.125, both signs, and 0."""
    mags = np.logspace(-30, 30, 241)
    bound = 0.125 * cap2 / qk_scale
    edge = bound * np.array([0.98, 0.999, 0.99999, 1.0, 1.00001, 1.001, 1.02, 4.0, 40.0])
    vals = np.concatenate([mags, edge, [0.0]])
    vals = vals[np.abs(vals * qk_scale) < 1e30]
    return np.concatenate([vals, -vals]).astype(np.float32)


@pytest.mark.parametrize("softcap", [1e-3, 1.0, 30.0, 1e30, 1e37, rules.MAX_SOFTCAP])
@pytest.mark.parametrize("qk_scale", [1.0, 0.125, 128 ** -0.5])
def test_softcap_scores_match_float64(device, softcap, qk_scale):
    cap2 = float(np.float32(softcap * contract.LOG2E))  # what the launcher passes (fp32)
    qk_scale = float(np.float32(qk_scale))
    qk = torch.from_numpy(_raw_dots(cap2, qk_scale)).to(device)
    s = torch.empty_like(qk)
    t = torch.empty_like(qk)
    n = qk.numel()
    _capped_scores[(1,)](qk, s, t, n, qk_scale, cap2, BLOCK=triton.next_power_of_2(n))
    x = qk.double().cpu() * qk_scale / cap2
    t_ref = torch.tanh(x)
    s_ref = cap2 * t_ref
    # fp32 leaves: a few ulps of the result (the GPU's approximate exp2 and reciprocal, ~2e-6 next to the bound),
    # the factor's own rounding where it is subnormal (a cap past ~2.4e38 times the scale), and t's absolute floor
    arg = qk_scale / cap2 * 2 * contract.LOG2E
    rel = 1e-5 + (2.0 ** -148 / arg if arg < 2.0 ** -126 else 0.0)
    floor = 2.0 ** -146
    s_err = (s.double().cpu() - s_ref).abs()
    t_err = (t.double().cpu() - t_ref).abs()
    bad_s = s_err > rel * s_ref.abs() + floor * cap2
    bad_t = t_err > rel * t_ref.abs() + floor
    assert not bad_s.any(), f"softcap {softcap}: s off at raw dots {qk.cpu()[bad_s][:5].tolist()}"
    assert not bad_t.any(), f"softcap {softcap}: t off at raw dots {qk.cpu()[bad_t][:5].tolist()}"
    assert math.isfinite(s.abs().max().item())
