"""Probe: does issuing the next key block's q.k^T before this block's softmax let Triton overlap the
tensor cores with the exp2s? (FlashAttention-3's intra-warpgroup overlap, written as a loop whose
scores are carried one iteration ahead.)

    python -m bench.prefetch_probe      (H200 answer: bench/results/attention_prefetch_probe_h200.txt)

A minimal forward (no masks, lengths a multiple of the tiles, head_dim a power of two) in two loop
orders: PREFETCH=False (scores of block j, then its softmax and p @ v) and PREFETCH=True (scores of
block j+1 issued, then block j's softmax and p @ v). Both are timed in turns with diyflash's forward,
and the compiled main loop's order of HGMMA, wgmma waits and MUFU.EX2 is printed for one tile each.
Not part of diyflash: a measured dead end, kept so that it can be re-run on a later Triton.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from bench.common import attention_flops, interleaved_times, quantiles


@triton.jit
def _softmax_pv(s, m_i, l_i, acc, v, qk_scale):
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def fwd(Q, K, V, O, sqz, sqh, sqm, skz, skh, skn, svz, svh, svn, soz, soh, som, N, qk_scale,
        D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREFETCH: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    z = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh + offs_m[:, None] * sqm + offs_d[None, :])
    kb = K + z.to(tl.int64) * skz + h.to(tl.int64) * skh
    vb = V + z.to(tl.int64) * svz + h.to(tl.int64) * svh
    k_ptrs = kb + offs_n[None, :] * skn + offs_d[:, None]
    v_ptrs = vb + offs_n[:, None] * svn + offs_d[None, :]
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if PREFETCH:
        s = tl.dot(q, tl.load(k_ptrs))
        for start in tl.range(BN, N, BN):
            s_next = tl.dot(q, tl.load(k_ptrs + start * skn))
            m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, tl.load(v_ptrs + (start - BN) * svn), qk_scale)
            s = s_next
        m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, tl.load(v_ptrs + (N - BN) * svn), qk_scale)
    else:
        for start in tl.range(0, N, BN):
            s = tl.dot(q, tl.load(k_ptrs + start * skn))
            m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, tl.load(v_ptrs + start * svn), qk_scale)
    out = acc / l_i[:, None]
    tl.store(O + z.to(tl.int64) * soz + h.to(tl.int64) * soh + offs_m[:, None] * som + offs_d[None, :],
             out.to(O.dtype.element_ty))


def run(q, k, v, bm, bn, w, s, prefetch):
    """The probe's forward of (B, H, N, D) q, k, v on (block_m, block_n, warps, stages) tiles."""
    o = torch.empty_like(q)
    b, h, n, d = q.shape
    fwd[(n // bm, h, b)](q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                                n, d ** -0.5 * 1.4426950408889634, D=d, BM=bm, BN=bn, PREFETCH=prefetch,
                                num_warps=w, num_stages=s)
    return o


def sass_summary(kernel) -> str:
    """The order of HGMMA, wgmma waits (WAIT), MUFU and branches in a compiled kernel's SASS (runs
    compressed: MUFUx34)."""
    import re
    import subprocess
    import tempfile
    cubin = kernel.asm["cubin"]  # cuobjdump: CUDA's, on the PATH of the GPU machine
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    lines = [l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", l)]
    seq = []
    for l in lines:
        for tok in ("HGMMA", "WARPGROUP.DEPBAR", "MUFU.EX2", "BRA", "WARPGROUP.ARRIVE"):
            if tok in l:
                seq.append(tok.split(".")[0] if tok != "WARPGROUP.DEPBAR" else "WAIT")
    out = []
    for t in seq:
        if out and out[-1][0] == t:
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return " ".join(f"{t}x{c}" if c > 1 else t for t, c in out)


def main() -> int:
    if not torch.cuda.is_available():
        print("prefetch_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    import diyflash

    torch.manual_seed(0)
    for b, h, d in ((4, 32, 64), (4, 16, 128)):
        for n in (1024, 4096, 16384):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
            ref = diyflash.flash_attention(q, k, v)
            fns = {"diyflash": lambda: diyflash.flash_attention(q, k, v)}
            cfgs = [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2)] if d == 64 else \
                [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 2)]
            for cfg in cfgs:
                for pf in (False, True):
                    try:
                        got = run(q, k, v, *cfg, pf)
                        err = (got.float() - ref.float()).abs().max().item()
                        if err > 1e-2:
                            print("WRONG", cfg, pf, err)
                            continue
                        fns[(cfg, pf)] = (lambda cfg=cfg, pf=pf: run(q, k, v, *cfg, pf))
                    except Exception as e:
                        print("fail", cfg, pf, type(e).__name__, str(e)[:100])
            times = interleaved_times(fns, rounds=4, round_ms=40)
            flops = attention_flops(b, h, n, n, d, False, "fwd")
            res = {name: flops / quantiles(t, (0.5,))[0] / 1e9 for name, t in times.items()}
            base = res["diyflash"]
            print(f"D{d} N{n}: diyflash {base:.0f}; " + "; ".join(
                f"{c[0]}{' pf' if c[1] else ''} {t:.0f}" for c, t in res.items() if c != "diyflash"), flush=True)
            if n == 4096:
                for cfg in cfgs[:1]:
                    for pf in (False, True):
                        kern = fwd.warmup(q, k, v, q, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *q.stride()[:3],
                                          n, 0.1, D=d, BM=cfg[0], BN=cfg[1], PREFETCH=pf, num_warps=cfg[2],
                                          num_stages=cfg[3], grid=(1,))
                        try:
                            print(f"  SASS {cfg} pf={pf}: {sass_summary(kern)[:600]}", flush=True)
                        except Exception as e:
                            print("  sass fail", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
