"""The probes' minimal FlashAttention forward, in one place: no masks, lengths a multiple of the tiles,
head_dim a power of two, (B, H, N, D) inputs with a contiguous head_dim. Not part of diyflash: the
measured variants of its main loop that bench/probes/prefetch_probe.py and bench/probes/exp2_probe.py time against
diyflash's forward.

- PREFETCH: the scores of key block j+1 are issued before block j's softmax and p @ v
  (FlashAttention-3's intra-warpgroup overlap, as a loop that carries its scores one iteration ahead).
- EMU = K > 0: the last 1/2^K of each score tile's columns are raised to 2^x by a polynomial on the FMA
  pipe, the rest by MUFU.EX2 (FlashAttention-4's exp2 emulation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# 2^f on [-1/2, 1/2], degree 3, fitted for relative error (max 7.5e-5; fp16 rounds at 4.9e-4)
C0 = tl.constexpr(0.9999280571937561)
C1 = tl.constexpr(0.6932609677314758)
C2 = tl.constexpr(0.2426111400127411)
C3 = tl.constexpr(0.0551716685295105)
ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: x + ROUND rounds x to an integer j held in the low mantissa bits


@triton.jit
def _exp2_fma(x):
    """2^x for x <= 0 without the MUFU: j = round(x), f = x - j in [-1/2, 1/2], 2^x = 2^f * 2^j, 2^j
    added straight into the exponent bits. x is clamped to -125 (2^-125 stands for anything smaller)."""
    x = tl.maximum(x, -125.0)
    t = x + ROUND
    f = x - (t - ROUND)
    p = ((C3 * f + C2) * f + C1) * f + C0
    # t's bits are (exponent, 2^22 + j); shifted by 23 they are j << 23 (mod 2^32): 2^j in the exponent
    return (p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def _halves(x):
    """Columns [0, n/2) and [n/2, n) of a 2-D tile (each thread keeps its own registers)."""
    BM: tl.constexpr = x.shape[0]
    BN: tl.constexpr = x.shape[1]
    return x.reshape([BM, 2, BN // 2]).permute(0, 2, 1).split()


@triton.jit
def _join(a, b):
    BM: tl.constexpr = a.shape[0]
    BN: tl.constexpr = a.shape[1]
    return tl.join(a, b).permute(0, 2, 1).reshape([BM, 2 * BN])


@triton.jit
def _exp2_mixed(x, EMU: tl.constexpr):
    """2^x with the last 1/2^EMU of the columns on the FMA pipe (EMU = 0: all on the MUFU)."""
    if EMU == 0:
        y = tl.math.exp2(x)
    elif EMU == 1:
        a, b = _halves(x)
        y = _join(tl.math.exp2(a), _exp2_fma(b))
    elif EMU == 2:
        a, b = _halves(x)
        b0, b1 = _halves(b)
        y = _join(tl.math.exp2(a), _join(tl.math.exp2(b0), _exp2_fma(b1)))
    else:
        a, b = _halves(x)
        b0, b1 = _halves(b)
        c0, c1 = _halves(b1)
        y = _join(tl.math.exp2(a), _join(tl.math.exp2(b0), _join(tl.math.exp2(c0), _exp2_fma(c1))))
    return y


@triton.jit
def _softmax_pv(s, m_i, l_i, acc, v, qk_scale, EMU: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = _exp2_mixed(s * qk_scale - m_new[:, None], EMU)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def fwd(Q, K, V, O, sqz, sqh, sqm, skz, skh, skn, svz, svh, svn, soz, soh, som, N, qk_scale,
        D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREFETCH: tl.constexpr, EMU: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    z = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh + offs_m[:, None] * sqm + offs_d[None, :])
    k_ptrs = K + z.to(tl.int64) * skz + h.to(tl.int64) * skh + offs_n[None, :] * skn + offs_d[:, None]
    v_ptrs = V + z.to(tl.int64) * svz + h.to(tl.int64) * svh + offs_n[:, None] * svn + offs_d[None, :]
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if PREFETCH:
        s = tl.dot(q, tl.load(k_ptrs))
        for start in tl.range(BN, N, BN):
            s_next = tl.dot(q, tl.load(k_ptrs + start * skn))
            m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, tl.load(v_ptrs + (start - BN) * svn), qk_scale, EMU)
            s = s_next
        m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, tl.load(v_ptrs + (N - BN) * svn), qk_scale, EMU)
    else:
        for start in tl.range(0, N, BN):
            s = tl.dot(q, tl.load(k_ptrs + start * skn))
            m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, tl.load(v_ptrs + start * svn), qk_scale, EMU)
    out = acc / l_i[:, None]
    tl.store(O + z.to(tl.int64) * soz + h.to(tl.int64) * soh + offs_m[:, None] * som + offs_d[None, :],
             out.to(O.dtype.element_ty))


def _args(q, k, v, o, scale):
    return (q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], q.shape[2], scale)


def run(q, k, v, bm, bn, w, s, prefetch=False, emu=0):
    """The minimal forward of (B, H, N, D) q, k, v on (block_m, block_n, warps, stages) tiles."""
    o = torch.empty_like(q)
    b, h, n, d = q.shape
    fwd[(n // bm, h, b)](*_args(q, k, v, o, d ** -0.5 * 1.4426950408889634), D=d, BM=bm, BN=bn,
                         PREFETCH=prefetch, EMU=emu, num_warps=w, num_stages=s)
    return o


def sass(q, tiles, prefetch=False, emu=0) -> list[str]:
    """The opcodes of the compiled kernel for q's shape on `tiles`, in order (cuobjdump: CUDA's, on the
    PATH of the GPU machine)."""
    import re
    import subprocess
    import tempfile

    kern = fwd.warmup(*_args(q, q, q, q, 0.1), D=q.shape[-1], BM=tiles[0], BN=tiles[1], PREFETCH=prefetch,
                      EMU=emu, num_warps=tiles[2], num_stages=tiles[3], grid=(1,))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.asm["cubin"])
        f.flush()
        text = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    return re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", text)
