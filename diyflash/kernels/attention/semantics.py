"""Which keys a query sees and how a row's softmax is kept: the masks, ranges, score modifications,
online-softmax step and epilogue every kernel (forward, backward, varlen, decode) applies, as small
@triton.jit helpers. attention_torch.py mirrors them in PyTorch. Which tiles a program computes, and in what
order, is tile_order.py's."""

from __future__ import annotations

from .._runtime import require_triton

triton = require_triton()
import triton.language as tl  # noqa: E402  (after the friendly import check above)

from .. import contract  # noqa: E402
from .._launch import compiled  # noqa: E402
from .lazy import LAZY_SLACK  # noqa: E402

# Base-2 units (kernels/contract.py): scores s2 = log2(e) * s, lse handed back in natural units (* ln 2)
LOG2E: tl.constexpr = tl.constexpr(contract.LOG2E)
LN2: tl.constexpr = tl.constexpr(contract.LN2)


@triton.jit
def _valid_lengths(seq_lens_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS: tl.constexpr):
    """Rows < q_len and keys < kv_len take part; the rest is padding."""
    q_len = seq_len_q
    kv_len = seq_len_k
    if HAS_SEQ_LENS:
        valid = tl.load(seq_lens_ptr + off_z)
        valid = tl.maximum(valid, 0)
        q_len = tl.minimum(q_len, valid)
        kv_len = tl.minimum(kv_len, valid)
    return q_len, kv_len



@triton.jit
def _sequence(lens_ptr, cu_k_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS: tl.constexpr, VARLEN: tl.constexpr):
    """Batch off_z's sequence: (q_start, k_start, q_len, kv_len, causal_offset). VARLEN (packed
    sequences): lens_ptr and cu_k_ptr are cu_seqlens_q and cu_seqlens_k, the sequence's rows start at
    q_start / k_start of the (1, H, total, D) views whose row counts are seq_len_q / seq_len_k, and the
    causal diagonal (and ALiBi's distance) is aligned bottom-right to its own lengths; the offsets are
    clamped into the views, so nothing is read out of bounds whatever the values. Else the rows start at
    0 of slice off_z, seq_lens caps both lengths (HAS_SEQ_LENS), and the diagonal aligns to N_k - N_q."""
    if VARLEN:
        q_start = tl.minimum(tl.maximum(tl.load(lens_ptr + off_z), 0), seq_len_q)
        q_end = tl.minimum(tl.maximum(tl.load(lens_ptr + off_z + 1), q_start), seq_len_q)
        k_start = tl.minimum(tl.maximum(tl.load(cu_k_ptr + off_z), 0), seq_len_k)
        k_end = tl.minimum(tl.maximum(tl.load(cu_k_ptr + off_z + 1), k_start), seq_len_k)
        q_len = q_end - q_start
        kv_len = k_end - k_start
        causal_offset = kv_len - q_len
    else:
        q_start = 0
        k_start = 0
        q_len, kv_len = _valid_lengths(lens_ptr, off_z, seq_len_q, seq_len_k, HAS_SEQ_LENS=HAS_SEQ_LENS)
        causal_offset = seq_len_k - seq_len_q
    return q_start, k_start, q_len, kv_len, causal_offset


@triton.jit
def _key_range(start_m, q_len, kv_len, causal_offset,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_SEQ_LENS: tl.constexpr, EVEN_N: tl.constexpr):
    """Key blocks of query rows [start_m, start_m + BLOCK_M): [0, full_hi) is visible to every row
    (no masks), [full_hi, hi) needs the key-length and causal masks. A block of padding rows (only
    with seq_lens: the grid has no block past N_q) gets an empty range.
    The non-causal bounds are kv_len itself where they can be: LLVM widens a loop counter to 64 bits
    when the bound is clamped (max, floor), which costs the forward's loop ~4 integer instructions per
    key block (Triton 3.6, sm_90 SASS)."""
    if CAUSAL:
        hi = tl.maximum(tl.minimum(kv_len, start_m + BLOCK_M + causal_offset), 0)
        full_hi = tl.maximum(tl.minimum(kv_len, start_m + 1 + causal_offset), 0) // BLOCK_N * BLOCK_N
    else:  # kv_len >= 0
        hi = kv_len
        full_hi = kv_len if EVEN_N else kv_len // BLOCK_N * BLOCK_N
    if HAS_SEQ_LENS:
        hi = tl.where(start_m < q_len, hi, 0)
        full_hi = tl.where(start_m < q_len, full_hi, 0)
    return full_hi, hi


# -- Variants. Scores in the kernels are base 2: s2 = log2(e) * s. Each helper below takes
# base-2 quantities, so a softcap or an ALiBi slope enters scaled by log2(e) too (the launcher does it). --


@triton.jit
def _prescaled(x, qk_scale):
    """The operand a program holds for its score dots (q, or k in the dk/dv kernel) times a power of two
    p2, and the rest of the scale: (x * p2, qk_scale / p2), p2 = 2^e <= 1 the power of qk_scale's exponent
    (e in [-64, 0]). Both factors are exact (exponent arithmetic on the bits), so (x * p2).y * rest rounds
    to the same bits as (x.y) * qk_scale; but the raw dot now overflows fp32 only where the scaled score
    itself leaves the fp32 range, not already where q.k passes 3.4e38 (bf16 inputs of ~1e19
    gave NaN where SDPA, which scales before its matmul, stays finite).
    fp16 x is returned as it is: its products stay below 65504^2 = 4.3e9, so no fp16 dot comes near fp32's
    range (the rule of launch.overflow_passes), while x * p2 would go subnormal below 6.1e-5 * 2^-e and
    lose bits that the raw forward keeps."""
    if x.dtype == tl.float16:
        return x, qk_scale
    else:
        p2, inv_p2 = _prescale_powers(qk_scale)
        return (x * p2).to(x.dtype), qk_scale * inv_p2


@triton.jit
def _prescale_powers(qk_scale):
    """(p2, 1 / p2) of _prescaled, both exact powers of two."""
    bits = tl.cast(qk_scale, tl.float32).to(tl.int32, bitcast=True)
    e = tl.minimum(tl.maximum((bits >> 23) & 0xFF, 63), 127)  # biased exponent of p2
    p2 = (e << 23).to(tl.float32, bitcast=True)
    inv_p2 = ((254 - e) << 23).to(tl.float32, bitcast=True)
    return p2, inv_p2


@triton.jit
def _unprescale(qk_scale, DTYPE: tl.constexpr):
    """What undoes _prescaled(x, qk_scale) on an x of DTYPE: 1 / p2 (1 for fp16), for a dot that reads the
    prescaled operand for another purpose than the scores (the backward's ds . k)."""
    if DTYPE == tl.float16:
        return 1.0
    else:
        return _prescale_powers(qk_scale)[1]


# -- Exact scores. Every kernel rounds the scaled score on its own (_mul_exact) before any
# exp2(s - m): a compiled kernel would otherwise contract s * scale - m into one FMA, whose single rounding
# is against m, so the row's top score got exp2 of up to half an ulp of m instead of exactly 1: gradients
# off from scores of ~1e4 on, p overflowing (NaN) from ~1e11. Costs one op per score where the FMA saved
# one (H100, bf16: head_dim 64 forward 2-5 % and backward 3-8 % slower, head_dim 128 unchanged). --
_COMPILED: tl.constexpr = tl.constexpr(compiled(_valid_lengths))


@triton.jit
def _mul_exact(a, b):
    """a * b, rounded on its own: PTX's mul.rn is never contracted into a following add, so exp2(s - m)
    sees the same s as the max did. Written as PTX (mul.rn.f32, subnormals kept): libdevice's mul_rn flushes
    them under Triton's ftz setting, and a softcap near fp32's largest, whose tanh argument is subnormal, then
    gave every score 0. The interpreter (numpy) never contracts."""
    if _COMPILED:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return a * b


@triton.jit
def _probs(s, lse2):
    """The backward's p = exp2(s - lse2) from the saved base-2 log-sum-exp, capped at 1 as it is
    mathematically: at huge scores the recomputed s (another dot order) and lse's round trip through
    natural units differ by ulps of the score, which exp2 would turn into inf."""
    return tl.math.exp2(tl.minimum(s - lse2, 0.0))


@triton.jit
def _probs_shifted(d, qk_rest):
    """_probs from d = raw - lse2 / qk_rest, the raw dot with the lse already subtracted (the Hopper backward's
    s^T accumulator starts at -lse2 / qk_rest): d * qk_rest is s - lse2, so _probs of it against 0 (x - 0.0 is
    x, which the compiler drops), capped at 1 by the same rule."""
    return _probs(d * qk_rest, 0.0)


@triton.jit
def _stats_shifted(lse2, delta, qk_scale, DTYPE: tl.constexpr):
    """The stats the Hopper backward's s^T and dp^T accumulators start at (its STATS_ACC), as the preprocess
    stores them: -lse2 / qk_rest and -delta, qk_rest = qk_scale * _unprescale(qk_scale) the rest of the scale
    _prescaled leaves on operands of DTYPE, so that each step starts its tiles from the stored rows with no
    arithmetic; s^T then comes out as d of _probs_shifted and dp^T as dp - delta. lse2 = +inf (a row that saw no
    key, or a padding row) gives -inf: p = 0."""
    return 0.0 - lse2 * (1.0 / (qk_scale * _unprescale(qk_scale, DTYPE=DTYPE))), 0.0 - delta


@triton.jit
def _rcp_fast(b):
    """1 / b by rcp.approx.ftz (one MUFU.RCP, within 1 ulp; 0 for |b| past 2^126, flushed) compiled; exact in
    the interpreter."""
    if _COMPILED:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / b


# The softcap's constants: tanh(x) = 1 - 2 / (exp2(k x) + 1) with k = 2 log2(e); near 0 (|x| < 0.125, where that
# form cancels) tanh's Taylor polynomial x - x^3/3 + 2 x^5/15 - 17 x^7/315 (error < 3e-10 relative there) in
# y = k x: the coefficients 1/k, -1/(3k^3), 2/(15k^5), -17/(315k^7)
_K = 2.0 * contract.LOG2E
TANH_ARG: tl.constexpr = tl.constexpr(_K)
TANH_SMALL: tl.constexpr = tl.constexpr(0.125 * _K)
TANH_C1: tl.constexpr = tl.constexpr(1.0 / _K)
TANH_C3: tl.constexpr = tl.constexpr(-1.0 / (3.0 * _K**3))
TANH_C5: tl.constexpr = tl.constexpr(2.0 / (15.0 * _K**5))
TANH_C7: tl.constexpr = tl.constexpr(-17.0 / (315.0 * _K**7))
FP32_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _tanh_of(y):
    """tanh(x) in fp32 to a few ulps, from y = 2 log2(e) x (the softcap's scores arrive with that factor folded
    into their scale), by 1 - 2 / (exp2(y) + 1), which saturates to +-1 without overflow, and the polynomial
    where that form cancels. Compiled, 1 / (exp2(y) + 1) is _rcp_fast's (the divisor is in [1, inf]; past
    2^126, where it gives 0, 1 - 0 is tanh's rounding anyway), then 1 - 2r: `2.0 / (...)` (div.full, with its
    range scaling) took 3 instructions more a score, and with it the softcapped forward took 1.16-1.20x the time
    (H200, bench/results/attention_sm90.jsonl, run "softcap tanh by rcp.approx"). A subnormal y (a cap near
    fp32's largest) takes the polynomial's plain multiplies, which keep it. Triton's interpreter has no
    libdevice, and both must compute the same thing."""
    big = 1.0 - 2.0 * _rcp_fast(tl.math.exp2(y) + 1.0)
    y2 = y * y
    small = y * (TANH_C1 + y2 * (TANH_C3 + y2 * (TANH_C5 + y2 * TANH_C7)))
    return tl.where(tl.abs(y) < TANH_SMALL, small, big)


@triton.jit
def _softcap_arg(qk_scale, inv_cap2):
    """The factor from a raw dot to _tanh_of's argument: qk_scale / cap2 * 2 log2(e), held within fp32's finite
    range (a scale near fp32's largest with a small softcap would make it inf, and a dot of 0 then NaN; held at
    the largest float, such a factor still takes any other dot past tanh's saturation, as the exact product
    would). One multiply a score where scaling, dividing by the cap and tanh's own factor took three: the
    softcapped forward 1.09x (H200, bench/results/attention_sm90.jsonl, run "softcap fold")."""
    arg = qk_scale * (inv_cap2 * TANH_ARG)
    return tl.minimum(tl.maximum(arg, -FP32_MAX), FP32_MAX)


@triton.jit
def _softcap(qk, cap2, arg_scale):
    """Gemma 2's logit softcap on base-2 scores: cap2 * tanh(s / cap2), with cap2 = softcap * log2(e)
    (the same as softcap * tanh(s_nat / softcap) in natural units), from the raw dot qk and arg_scale =
    _softcap_arg(scale, 1 / cap2): s / cap2 scaled for _tanh_of in one multiply. Also returns t = tanh(.):
    the backward's chain factor is 1 - t^2. The product rounded on its own, as the scale is: left to the
    compiler, it met the softmax's s - m in an FMA in some forms of a kernel and not in others. With a cap
    past ~2.4e38 times the scale (base 2), arg_scale and t are subnormal and kept so (_inv, _mul_exact): the
    score then has the factor's relative rounding, ~2e-6 at the largest cap, where a flush had made it 0."""
    t = _tanh_of(qk * arg_scale)
    return _mul_exact(cap2, t), t


@triton.jit
def _alibi(s, q_pos, k_pos, causal_offset, slope2):
    """ALiBi: s - slope * |i + N_k - N_q - j| (slope2 = slope * log2(e), q_pos/k_pos broadcastable)."""
    dist = q_pos + causal_offset - k_pos
    return s - slope2 * tl.abs(dist).to(tl.float32)


@triton.jit
def _slope(alibi_ptr, off_z, stride_az, off_h, ALIBI: tl.constexpr):
    """Head off_h's ALiBi slope in base 2 (slope * log2(e)); 0.0 without ALIBI. stride_az: 0 for (H,)
    slopes, the batch stride for (B, H)."""
    if ALIBI:
        slope2 = tl.load(alibi_ptr + off_z.to(tl.int64) * stride_az + off_h).to(tl.float32) * LOG2E
    else:
        slope2 = 0.0
    return slope2


# A sink logit (gpt-oss) starts every row's online softmax: max = the sink in base 2, sum = 1. A sink past
# SINK_CAP2 in base 2 (+inf included, ~5.9e37 in natural units) starts at SINK_CAP2 instead, where sink * log2(e)
# would leave fp32's range (inf - inf = NaN in the first rescale): every key's p is then exp2(s - SINK_CAP2) = 0,
# the output 0, and _sink_lse gives lse the sink itself: it holds all of its row's mass, as it does on the
# PyTorch path (contract.SINK_CAP) and in the reference.
SINK_CAP2: tl.constexpr = tl.constexpr(contract.SINK_CAP2)


@triton.jit
def _sink_start(sink, BLOCK_M: tl.constexpr):
    """(m, l) of rows that start with this sink logit (natural units, fp32; a scalar or one per row)."""
    m = tl.minimum(sink * LOG2E, SINK_CAP2) + tl.zeros([BLOCK_M], dtype=tl.float32)
    return m, tl.full([BLOCK_M], 1.0, dtype=tl.float32)


@triton.jit
def _sink_lse(lse, sink):
    """A row's natural-log lse where it started with `sink`: the sink itself (or a larger lse) where the sink
    was past SINK_CAP2, whose mass is then all of the row's; lse elsewhere."""
    return tl.where(sink * LOG2E >= SINK_CAP2, tl.maximum(lse, sink), lse)


@triton.jit
def _inv(cap2, SOFTCAP: tl.constexpr):
    """1 / cap2 for the softcap (0.0 without SOFTCAP: unused), once a program. Compiled by PTX's div.rn.f32, which
    keeps a subnormal quotient (a cap near fp32's largest) where Triton's `/` (div.full) need not."""
    if SOFTCAP:
        if _COMPILED:
            inv = tl.inline_asm_elementwise("div.rn.f32 $0, $1, $2;", "=r,r,r", [1.0, cap2], dtype=tl.float32,
                                            is_pure=True, pack=1)
        else:
            inv = 1.0 / cap2
    else:
        inv = 0.0
    return inv


@triton.jit
def _scores(qk, q_pos, k_pos, causal_offset, qk_scale, cap2, inv_cap2, slope2,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """The base-2 scores of a raw q.k tile: scaled (rounded on its own: _mul_exact), softcapped,
    ALiBi-biased (in that order, before any mask). Returns (s, t), t the softcap's tanh for the backward
    (without SOFTCAP, s again: unused)."""
    if SOFTCAP:  # the scale also goes into tanh's argument, with the cap (_softcap_arg)
        s, t = _softcap(qk, cap2, _softcap_arg(qk_scale, inv_cap2))
    else:
        s = _mul_exact(qk, qk_scale)
        t = s
    if ALIBI:
        s = _alibi(s, q_pos, k_pos, causal_offset, slope2)
    return s, t


@triton.jit
def _visible(q_pos, k_pos, kv_len, causal_offset, win_left, win_right,
             KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """Whether query q_pos sees key k_pos (broadcastable index tiles): keys below kv_len (KEY_MASK),
    j <= i + off (CAUSAL), i + off - left <= j <= i + off + right (WINDOW; the launcher passes an
    unbounded side as N_q + N_k, and caps right at 0 under causal). At least one flag is set."""
    diag = q_pos + causal_offset
    if KEY_MASK:
        vis = k_pos < kv_len
        if CAUSAL:
            vis = vis & (k_pos <= diag)
    elif CAUSAL:
        vis = k_pos <= diag
    else:
        tl.static_assert(WINDOW)
        vis = k_pos <= diag + win_right
    if WINDOW:
        vis = vis & (k_pos >= diag - win_left) & (k_pos <= diag + win_right)
    return vis


@triton.jit
def _from_start(vis, k_pos, kv_start, LEFTPAD: tl.constexpr):
    """And keys from kv_start on (LEFTPAD): a left-padded KV cache's first kv_start slots hold no keys
    (flash-attn's cache_leftpad). Positions keep counting from slot 0, so causal, window and ALiBi
    distances are those of the keys that are there. attention_torch._visible's kv_start mirrors it."""
    if LEFTPAD:
        vis = vis & (k_pos >= kv_start)
    return vis


@triton.jit
def _band(start_m, q_len, kv_len, causal_offset, win_left, win_right,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
          HAS_SEQ_LENS: tl.constexpr, EVEN_N: tl.constexpr, WINDOW: tl.constexpr):
    """Key blocks of query rows [start_m, start_m + BLOCK_M) in three ranges: [lo, full_lo) masked
    (the window's left edge), [full_lo, full_hi) visible to every row (no masks), [full_hi, hi) masked
    (causal diagonal, window's right edge, key length). Without WINDOW, lo = full_lo = 0 and the rest
    is _key_range, so a dense kernel compiles as before; with it, blocks outside the band are skipped."""
    if WINDOW:
        lo = tl.maximum(start_m + causal_offset - win_left, 0) // BLOCK_N * BLOCK_N
        hi = tl.maximum(tl.minimum(kv_len, start_m + BLOCK_M + causal_offset + win_right), 0)
        full_lo = tl.cdiv(tl.maximum(start_m + BLOCK_M - 1 + causal_offset - win_left, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.maximum(tl.minimum(kv_len, start_m + 1 + causal_offset + win_right), 0) // BLOCK_N * BLOCK_N
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
        if HAS_SEQ_LENS:
            hi = tl.where(start_m < q_len, hi, 0)
            lo = tl.minimum(lo, hi)
            full_lo = tl.minimum(full_lo, hi)
            full_hi = tl.minimum(full_hi, hi)
    else:
        lo = 0
        full_lo = 0
        full_hi, hi = _key_range(
            start_m, q_len, kv_len, causal_offset, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL,
            HAS_SEQ_LENS=HAS_SEQ_LENS, EVEN_N=EVEN_N,
        )
    return lo, full_lo, full_hi, hi


@triton.jit
def _query_band(start_n, q_len, kv_len, causal_offset, win_left, win_right,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """Query rows that see keys [start_n, start_n + BLOCK_N), for the dk/dv kernel: [lo, mid) masked
    (causal diagonal or the window's right edge), [mid, full_end) see every key of the block (no masks),
    [max(mid, full_end), hi) masked (query-length tail, the window's left edge). A partial key block
    masks every row; a block of padding keys is seen by none (dk = dv = 0)."""
    if WINDOW:  # the launcher caps win_right at 0 under causal
        lo = tl.maximum(start_n - causal_offset - win_right, 0) // BLOCK_M * BLOCK_M
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset - win_right, 0), BLOCK_M) * BLOCK_M
        mid = tl.maximum(mid, lo)
        hi = tl.minimum(q_len, tl.maximum(start_n + BLOCK_N - causal_offset + win_left, 0))
        full_end = tl.minimum(q_len, tl.maximum(start_n + 1 - causal_offset + win_left, 0)) // BLOCK_M * BLOCK_M
    elif CAUSAL:
        lo = tl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M
        # rows i >= start_n + BLOCK_N - 1 - causal_offset see every key of this block
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0), BLOCK_M) * BLOCK_M
        mid = tl.maximum(mid, lo)
        hi = q_len
        full_end = q_len // BLOCK_M * BLOCK_M
    else:
        lo = 0
        mid = 0
        hi = q_len
        full_end = q_len // BLOCK_M * BLOCK_M
    mid = tl.where(start_n + BLOCK_N > kv_len, tl.cdiv(q_len, BLOCK_M) * BLOCK_M, mid)
    lo = tl.where(start_n >= kv_len, mid, lo)
    return lo, mid, full_end, hi


# -- A row's softmax, kept online over key blocks (forward and decode), and its epilogue. --


@triton.jit
def _subtrahend(m_new, MASKED: tl.constexpr):
    """What the online softmax subtracts from a block's scores: the row's new max, or with MASKED 0 where the
    row has seen no visible key yet (m = -inf), so exp2 gives 0 there, not NaN."""
    if MASKED:
        return tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new


@triton.jit
def _online_softmax(s, m_i, l_i, MASKED: tl.constexpr, LAZY: tl.constexpr):
    """One key block of a row's online softmax, base 2: s the block's scores (-inf where not visible), m_i
    and l_i the running max and sum. Returns (p, alpha, grew, m_new, l_new): the block's exp2(s - m_new),
    the factor alpha = exp2(m_i - m_new) that rescales what was accumulated (acc * alpha + p @ v), and the
    new max and sum. LAZY: the max moves only where the block's passes it by more than LAZY_SLACK (alpha
    exactly 1 elsewhere; `grew` marks the rows that moved, for lazy._rescale). MASKED: a row with no
    visible key yet keeps m = -inf (_subtrahend)."""
    m_blk = tl.max(s, 1)
    if LAZY:
        grew = m_blk > m_i + LAZY_SLACK
        m_new = tl.where(grew, m_blk, m_i)
    else:
        m_new = tl.maximum(m_i, m_blk)
        grew = m_new > m_i  # every row rescales without LAZY: unused, and compiled away
    m_sub = _subtrahend(m_new, MASKED=MASKED)
    p = tl.math.exp2(s - m_sub[:, None])
    alpha = tl.math.exp2(m_i - m_sub)
    if LAZY:
        alpha = tl.where(grew, alpha, 1.0)
    return p, alpha, grew, m_new, l_i * alpha + tl.sum(p, 1)


# _online_softmax_fma's bound on a row's |max| in base-2 units: below it the FMA's rounding moves the top score's
# exp2 by at most 2^-5 in its exponent (half an ulp of 2^20); a row that reaches it is marked (_fma_marked) and
# computed again in the exact form.
FMA_MAX_ROW: tl.constexpr = tl.constexpr(2.0**20)


@triton.jit
def _online_softmax_fma(qk, m_i, l_i, qk_scale, MASKED: tl.constexpr):
    """_online_softmax from the raw q.k tile (keys not visible at -inf) with the scale folded into exp2's
    argument, as FlashAttention does: m = max(qk) * qk_scale (the max of the rounded scores: qk_scale > 0,
    and rounding keeps the order), p = exp2(qk * qk_scale - m), one FMA a score (tl.fma: not left to the
    compiler's contraction, which Triton 3.10 turns off by default) where the exact form (_scores' rounded
    score, then s - m) takes a multiply and a subtract. The FMA rounds once, against the
    unrounded product, so the row's top score gets exp2(e), e the rounding error of its product (at most half
    an ulp of m), where the exact form gets exactly 1: a factor l and the accumulator share, which out = acc /
    l cancels and lse = m + log2(l) keeps. Where |m| grows, so does e: exp2(e) overflows from |m| ~ 2^31.
    Returns (p, alpha, m_new, l_new, top): top = |m| as subtracted, which the caller keeps the largest of and
    hands to _fma_marked, which marks the rows past FMA_MAX_ROW for the exact form."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    m_sub = _subtrahend(m_new, MASKED=MASKED)
    p = tl.math.exp2(tl.fma(qk, qk_scale, -m_sub[:, None]))
    alpha = tl.math.exp2(m_i - m_sub)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1), tl.abs(m_sub)


@triton.jit
def _fma_marked(lse, top):
    """lse with NaN where a row's largest |max| (`top`, kept over _online_softmax_fma's blocks; +inf where a
    raw dot overflowed) reached FMA_MAX_ROW: the portable forward's second pass (PASS 2) computes the blocks
    holding such a row again in the exact form. A row that is NaN anyway stays NaN there too."""
    return tl.where(top >= FMA_MAX_ROW, float("nan"), lse)


@triton.jit
def _normalize(acc, m_i, l_i, live):
    """A row's (out, lse) from its accumulator and running max and sum: out = acc / l, lse = m + log2(l)
    in natural units. Rows not `live` (no key seen: l == 0, acc == 0) keep acc (0) and get lse = -inf."""
    l_safe = tl.where(live, l_i, 1.0)
    lse = tl.where(live, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    return acc / l_safe[:, None], lse


@triton.jit
def _merge_rows(part_out, part_lse, row_ok, sink, num_splits, stride_os, stride_ls, offs_dv, dv_mask,
                SINKS: tl.constexpr, SPLITS_PAD: tl.constexpr, MARKS: tl.constexpr):
    """Merge the splits of some query rows (part_out / part_lse: [ROWS] pointers to each row's split 0, fp32,
    a partial's columns contiguous): out = sum_s exp(lse_s - lse) out_s, lse = log(sum_s exp(lse_s)
    [+ exp(sink)]), a row no split saw 0 with lse -inf (the sink's with SINKS). The splits are added one
    after another in split order (a static unroll: every load in flight at once), so the bits depend on the
    values alone: MERGE in the decode launch and the combine kernel give the same. Loads bypass L1 (.cg:
    other programs wrote the partials). MARKS: a split's NaN lse (_fma_marked: the row is computed again by
    the second pass) makes the row's lse NaN (the max below skips a NaN, which would then read as no key)."""
    m = tl.full(row_ok.shape, float("-inf"), dtype=tl.float32)
    none = tl.zeros(row_ok.shape, dtype=tl.int32)  # (a split's index as a tensor: one mask type everywhere)
    marked = none
    for s in tl.static_range(SPLITS_PAD):
        lse_s = tl.load(part_lse + s * stride_ls, mask=row_ok & (none + s < num_splits), other=float("-inf"),
                        cache_modifier=".cg")
        m = tl.maximum(m, lse_s)
        if MARKS:
            marked = tl.maximum(marked, (lse_s != lse_s).to(tl.int32))
    if SINKS:  # natural units here: the sink capped as _sink_start caps it (SINK_CAP2 * ln 2)
        sink_c = tl.minimum(sink, SINK_CAP2 * LN2)
        m = tl.maximum(m, sink_c)
    m_sub = _subtrahend(m, MASKED=True)
    total = tl.zeros(row_ok.shape, dtype=tl.float32)
    acc = tl.zeros([row_ok.shape[0], offs_dv.shape[0]], dtype=tl.float32)
    for s in tl.static_range(SPLITS_PAD):
        ok = row_ok & (none + s < num_splits)
        w = tl.exp(tl.load(part_lse + s * stride_ls, mask=ok, other=float("-inf"), cache_modifier=".cg") - m_sub)
        total += w
        acc += tl.load(part_out[:, None] + s * stride_os + offs_dv[None, :], mask=ok[:, None] & dv_mask[None, :],
                       other=0.0, cache_modifier=".cg") * w[:, None]
    if SINKS:
        total += tl.exp(sink_c - m_sub)
    live = total > 0
    total = tl.where(live, total, 1.0)
    lse = tl.where(live, m_sub + tl.log(total), float("-inf"))
    if SINKS:
        lse = _sink_lse(lse, sink)
    if MARKS:
        lse = tl.where(marked > 0, float("nan"), lse)
    return acc / total[:, None], lse


@triton.jit
def _decode_keys(i_lo, i_hi, kv_len, kv_start, causal_offset, win_left, win_right, split, num_splits,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, LEFTPAD: tl.constexpr):
    """The keys [my_lo, my_hi) a decode program reads: those any of its query positions [i_lo, i_hi] can
    see (causal diagonal and window band as _visible draws them, from kv_start on with LEFTPAD), cut into
    num_splits BLOCK_N-aligned ranges of which it takes number `split`."""
    hi = kv_len
    lo = 0
    if CAUSAL:
        hi = tl.minimum(hi, i_hi + causal_offset + 1)
    if WINDOW:
        hi = tl.minimum(hi, i_hi + causal_offset + win_right + 1)
        lo = tl.maximum(i_lo + causal_offset - win_left, 0) // BLOCK_N * BLOCK_N
    if LEFTPAD:  # a left-padded cache: no program reads the steps before its first key
        lo = tl.maximum(lo, kv_start // BLOCK_N * BLOCK_N)
    hi = tl.maximum(hi, lo)
    chunk = tl.cdiv(tl.cdiv(hi - lo, num_splits), BLOCK_N) * BLOCK_N
    my_lo = lo + split * chunk
    return my_lo, tl.minimum(my_lo + chunk, hi)
