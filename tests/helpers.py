"""One seeded input factory for every test (numerics, opcheck, compile, export). The error rule lives
in diyflash.utils.validation, shared with `python -m diyflash`."""

from __future__ import annotations

import os

import torch

import diyflash
from conftest import DEVICE
from diyflash.reference import attention_ref, attention_varlen_ref
from diyflash.utils.validation import compare_with_oracle, error_report

ON_GPU = DEVICE == "cuda"
# bf16 runs on CPU too: under the interpreter its tiles are widened to fp32 before tl.dot
# (triton-lang/triton#11584), so bf16 numerics that matter are the GPU suite's.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def make_qkv(
    b: int,
    h: int,
    n_q: int,
    n_k: int,
    d: int,
    dtype: torch.dtype = torch.float16,
    device: torch.device | str = DEVICE,
    layout: str = "bhnd",
    requires_grad: bool = False,
    seed: int = 0,
):
    """q (b, h, n_q, d), k and v (b, h, n_k, d), drawn from a seeded generator.

    layout: "bhnd" contiguous; "bnhd" a (b, h, n, d) view of (b, n, h, d) storage (non-contiguous,
    read in place by the kernels); "3d" (b*h, n, d); "sliced" a view of a wider head_dim buffer
    (non-dense: rows are strided past the data).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def one(n: int) -> torch.Tensor:
        if layout == "bnhd":
            t = torch.randn(b, n, h, d, generator=gen).to(device=device, dtype=dtype).transpose(1, 2)
        elif layout == "3d":
            t = torch.randn(b * h, n, d, generator=gen).to(device=device, dtype=dtype)
        elif layout == "sliced":
            t = torch.randn(b, h, n, d + 8, generator=gen).to(device=device, dtype=dtype)[..., :d]
        else:
            assert layout == "bhnd", layout
            t = torch.randn(b, h, n, d, generator=gen).to(device=device, dtype=dtype)
        return t.requires_grad_(requires_grad)

    return one(n_q), one(n_k), one(n_k)


def random_like(t: torch.Tensor, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(t.shape, generator=gen).to(device=t.device, dtype=t.dtype)


def copies_of(fn, *tensors) -> list[str]:
    """aten copy/clone/contiguous calls made while running fn whose input has the shape of one of
    `tensors`: a silent full copy of an operand. (Triton's interpreter copies every argument's storage
    in and out as flat byte buffers; those are 1-D and not counted.)"""
    shapes = {tuple(t.shape) for t in tensors}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    names = ("aten::contiguous", "aten::clone", "aten::copy_", "aten::_to_copy")
    return [f"{e.name}{e.input_shapes}" for e in prof.events()
            if e.name in names and any(tuple(s) in shapes for s in e.input_shapes if s)]


def slopes(h, b=None, device="cpu"):
    """ALiBi slopes (h,), or (b, h) scaled per batch row: the variants' and varlen tests' one recipe."""
    base = torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)])
    return (base if b is None else base * torch.linspace(0.5, 1.5, b)[:, None]).to(device)


def sink_logits(h, device="cpu"):
    """Seeded sink logits (h,)."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    return torch.randn(h, generator=gen).to(device)


def opcheck_backward(fwd, bwd, args):
    """opcheck ALL of a backward op (attention_bwd, attention_varlen_bwd) on its forward op's outputs for
    args (the forward's arguments), without and with a gradient of lse."""
    out, lse = fwd(*args)
    gen = torch.Generator(device="cpu").manual_seed(3)
    dout = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    dlse = torch.randn(lse.shape, generator=gen).to(lse.device)
    for dl in (None, dlse):
        torch.library.opcheck(bwd, (dout, dl, *args[:3], out, lse, *args[3:]), test_utils="ALL")


def cancellation_bands(q, k, v, dout, scale: float) -> dict:
    """Rounding bands for dq, dk (dv: 0) at the scale of their terms, for where plain autograd is exact
    by algebra and FlashAttention is not: ds = p (dp - delta) cancels two fp32 sums of ~|dp| taken in
    different orders (~eps |dp| each), and dq = scale ds k, dk = scale ds^T q sum many such terms (over
    keys, or over rows and a GQA group's heads). 64 fp32 ulps of scale |dp| |k| or |q|: room for ~4 ulps
    per term over a random walk of 256 terms. (B, H, N, D) inputs, k and v with H_kv heads."""
    group = q.shape[-3] // k.shape[-3] if q.dim() == 4 else 1
    v_q = v.double().repeat_interleave(group, dim=-3) if group > 1 else v.double()
    dp = (dout.double() @ v_q.transpose(-1, -2)).abs().max().item()
    eps = 64 * torch.finfo(torch.float32).eps * scale * dp
    return {"dq": eps * k.double().abs().max().item(), "dk": eps * q.double().abs().max().item(), "dv": 0.0}


def _attention_op(q, k, v, causal, scale, seq_lens):
    return torch.ops.diyflash.attention(q, k, v, causal=causal, scale=scale, seq_lens=seq_lens)


def check_attention(q, k, v, causal, scale=None, seq_lens=None, grad=True):
    """Run diyflash's op and both references; assert the error rule on out and (optionally) dq, dk, dv."""
    from diyflash.utils.validation import attention_error_reports

    out, grads, reports = attention_error_reports(_attention_op, q, k, v, causal, scale, seq_lens, grad=grad)
    assert out.dtype == q.dtype and out.shape == q.shape
    for g, t in zip(grads or (), (q, k, v)):
        assert g.dtype == t.dtype and g.shape == t.shape
    for report in reports:
        assert report.ok, str(report)
    return out


# -- KV-cache cases (test_attention_kvcache.py, test_kvcache_host.py) --


def seeded_randn(shape, dtype, device, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


class KVCase:
    """A batch of caches with their new keys: contiguous (B, H_kv, N_cache, D) viewed from (B, N_cache,
    H_kv, D) storage, and the same keys paged into a shuffled pool of pages."""

    def __init__(self, b=3, h=8, h_kv=2, n_q=1, n_new=1, d=16, dv=None, lens=(10, 0, 90), capacity=128,
                 page_size=16, dtype=torch.float16, device="cpu", seed=0, leftpad=None):
        dv = d if dv is None else dv
        self.b, self.h, self.h_kv, self.n_q, self.n_new, self.d, self.dv = b, h, h_kv, n_q, n_new, d, dv
        self.capacity, self.page_size = capacity, page_size
        self.q = seeded_randn((b, h, n_q, d), dtype, device, seed)
        self.k_cache = seeded_randn((b, capacity, h_kv, d), dtype, device, seed + 1).transpose(1, 2)
        self.v_cache = seeded_randn((b, capacity, h_kv, dv), dtype, device, seed + 2).transpose(1, 2)
        self.k = seeded_randn((b, h_kv, n_new, d), dtype, device, seed + 3) if n_new else None
        self.v = seeded_randn((b, h_kv, n_new, dv), dtype, device, seed + 4) if n_new else None
        self.seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        self.leftpad = None if leftpad is None else torch.tensor(leftpad, dtype=torch.int32, device=device)
        pages = capacity // page_size
        gen = torch.Generator(device="cpu").manual_seed(seed + 5)
        order = torch.randperm(b * pages + 3, generator=gen)[:b * pages]  # a pool with 3 pages no batch uses
        self.block_table = order.view(b, pages).to(torch.int32).to(device)
        pool = b * pages + 3
        self.k_pages = seeded_randn((pool, h_kv, page_size, d), dtype, device, seed + 6)
        self.v_pages = seeded_randn((pool, h_kv, page_size, dv), dtype, device, seed + 7)
        for cache, pages_ in ((self.k_cache, self.k_pages), (self.v_cache, self.v_pages)):
            for i in range(b):  # the same keys in both layouts
                blocks = cache[i].unflatten(1, (pages, page_size)).transpose(0, 1)  # (pages, H_kv, page, D)
                pages_[self.block_table[i].long()] = blocks

    def caches(self, paged):
        if paged:
            return self.k_pages.clone(), self.v_pages.clone(), self.block_table
        return (self.k_cache.clone().transpose(1, 2).contiguous().transpose(1, 2),
                self.v_cache.clone().transpose(1, 2).contiguous().transpose(1, 2), None)

    def dense_keys(self):
        """(k, v) of every batch after the append, as (B, H_kv, capacity, D) in float64."""
        k, v = self.k_cache.double().clone(), self.v_cache.double().clone()
        for i in range(self.b):
            s = int(self.seqlens[i])
            if self.n_new:
                k[i, :, s:s + self.n_new] = self.k[i].double()
                v[i, :, s:s + self.n_new] = self.v[i].double()
        return k, v

    def run(self, paged=False, **kw):
        k_cache, v_cache, bt = self.caches(paged)
        if self.q.dtype == torch.float64:  # the op itself: the API takes fp16, bf16 and fp32
            out, lse = torch.ops.diyflash.attention_with_kvcache(
                self.q, k_cache, v_cache, self.seqlens, self.k, self.v, bt, kw["causal"], None, *kw["window_size"],
                kw["softcap"], kw["alibi_slopes"], kw["sinks"], kw["num_splits"], self.leftpad)
        else:
            out, lse = diyflash.flash_attention_with_kvcache(self.q, k_cache, v_cache, self.seqlens, self.k, self.v,
                                                             block_table=bt, cache_leftpad=self.leftpad,
                                                             return_lse=True, **kw)
        return out, lse, k_cache, v_cache


def kvcache_oracle(case, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None, sinks=None, upcast=True):
    k, v = case.dense_keys()
    outs, lses = [], []
    for i in range(case.b):
        n = int(case.seqlens[i]) + case.n_new
        start = 0 if case.leftpad is None else int(case.leftpad[i])  # a left-padded batch: its keys from there
        q = case.q[i:i + 1]
        kk, vv = k[i:i + 1, :, start:n], v[i:i + 1, :, start:n]
        if not upcast:
            kk, vv = kk.to(q.dtype), vv.to(q.dtype)
        al = alibi if alibi is None or alibi.dim() == 1 else alibi[i:i + 1]
        o, l = attention_ref(q, kk, vv, causal, scale, None, upcast, window_size=window, softcap=softcap,
                             alibi_slopes=al, sinks=sinks)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def check_kvcache(case, paged=False, **kw):
    ref_kw = {name: kw[name] for name in ("causal", "window", "softcap", "alibi", "sinks") if name in kw}
    api_kw = dict(causal=kw.get("causal", False), window_size=kw.get("window", (-1, -1)),
                  softcap=kw.get("softcap", 0.0), alibi_slopes=kw.get("alibi"), sinks=kw.get("sinks"),
                  num_splits=kw.get("num_splits", 0))
    out, lse, k_cache, v_cache = case.run(paged, **api_kw)
    want, want_lse = kvcache_oracle(case, **ref_kw)
    plain, _ = kvcache_oracle(case, upcast=False, **ref_kw)
    report = error_report("out", out, want, plain)
    assert report.ok, str(report)
    assert out.shape == (case.b, case.h, case.n_q, case.dv) and out.dtype == case.q.dtype
    lse_dtype = torch.float64 if case.q.dtype == torch.float64 else torch.float32
    assert lse.shape == (case.b, case.h, case.n_q) and lse.dtype == lse_dtype
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    # the cache after the call: the new keys at cache_seqlens[b] + j, nothing else changed
    k_want, v_want = case.dense_keys()
    if paged:
        pages = case.capacity // case.page_size
        k_cache = torch.stack([k_cache[case.block_table[i].long()].transpose(0, 1).flatten(1, 2)
                               for i in range(case.b)])
        v_cache = torch.stack([v_cache[case.block_table[i].long()].transpose(0, 1).flatten(1, 2)
                               for i in range(case.b)])
        assert k_cache.shape[2] == pages * case.page_size
    assert torch.equal(k_cache.double(), k_want) and torch.equal(v_cache.double(), v_want)
    return out, lse


# -- the Hopper kernels' GPU tests (test_hopper.py, test_hopper_backward.py) --

def hopper_here() -> bool:
    """Whether this run has an sm_90 GPU where the Hopper kernels can run."""
    from diyflash.kernels.attention import hopper

    return ON_GPU and hopper.status(torch.device("cuda"))[0]


def kernels_run(call, hopper_name: str, portable_name: str) -> set[str]:
    """Which of two kernels call() launched ({"hopper", "portable"}), from the profiler's kernel names; the
    caches cleared first, so the call takes a fresh route, not a kept plan."""
    from torch.profiler import ProfilerActivity, profile

    diyflash.clear_caches()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    return ({"hopper"} if any(hopper_name in n for n in names) else set()) | (
        {"portable"} if any(portable_name in n for n in names) else set())


# -- packed sequences (flash_attention_varlen) --


def cu(lens, device):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


def packed(lens_q, lens_k, h, h_kv, d, dv=None, dtype=torch.float16, device="cpu", layout="thd", seed=0):
    """q (T_q, H, D), k (T_k, H_kv, D), v (T_k, H_kv, D_v). layout "thd": contiguous; "qkv": q, k, v
    slices of one (T, H + 2 H_kv, D) projection (the usual fused-qkv buffer: strided tokens); "htd": views
    of (H, T, D) storage (token stride D)."""
    dv = d if dv is None else dv
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t_q, t_k = sum(lens_q), sum(lens_k)
    if layout == "qkv":
        assert t_q == t_k and dv == d
        buf = torch.randn(t_q, h + 2 * h_kv, d, generator=gen).to(device=device, dtype=dtype)
        return buf[:, :h], buf[:, h:h + h_kv], buf[:, h + h_kv:]

    def one(t, heads, dim):
        if layout == "htd":
            return torch.randn(heads, t, dim, generator=gen).to(device=device, dtype=dtype).transpose(0, 1)
        return torch.randn(t, heads, dim, generator=gen).to(device=device, dtype=dtype)

    return one(t_q, h, d), one(t_k, h_kv, d), one(t_k, h_kv, dv)


def check_varlen(q, k, v, lens_q, lens_k, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None, sinks=None):
    """flash_attention_varlen against the per-sequence oracle: out with every gradient, then lse with a
    loss on lse alone, each under the 2x rule; rows with lse = -inf agree exactly."""
    cu_q, cu_k = cu(lens_q, q.device), cu(lens_k, q.device)
    max_q, max_k = max(lens_q), max(lens_k)
    kw = dict(window_size=window, softcap=softcap, alibi_slopes=alibi)
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    names = ("dq", "dk", "dv", "dsinks")[:len(inputs)]

    def ours(q, k, v, s=None):
        return diyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, sinks=s,
                                               return_lse=True, **kw)

    def ref(q, k, v, s=None, upcast=True):
        return attention_varlen_ref(q, k, v, cu_q, cu_k, causal, scale, upcast, sinks=s, **kw)

    out, grads, reports = compare_with_oracle(lambda *t: ours(*t)[0], lambda *t, upcast: ref(*t, upcast=upcast)[0],
                                              inputs, "out", names)
    lse_inputs = (q, k) if sinks is None else (q, k, sinks)
    gen = torch.Generator(device="cpu").manual_seed(5)
    dlse = torch.randn(q.shape[1], q.shape[0], generator=gen).to(q.device)
    finite = lambda t: torch.where(torch.isneginf(t), 0.0, t)  # noqa: E731
    _, _, lse_reports = compare_with_oracle(
        lambda q, k, *s: finite(ours(q, k, v.to(q.dtype), *s)[1]),
        lambda q, k, *s, upcast: finite(ref(q, k, v.to(q.dtype), *s, upcast=upcast)[1]),
        lse_inputs, "lse", tuple(f"{n} (via lse)" for n in ("dq", "dk", "dsinks")[:len(lse_inputs)]), dout=dlse)
    for report in reports + lse_reports:
        assert report.ok, str(report)
    lse = ours(q, k, v, sinks)[1]
    want = ref(q.double(), k.double(), v.double(), None if sinks is None else sinks.double())[1]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want)), "rows with lse = -inf differ"
    assert out.shape == (q.shape[0], q.shape[1], v.shape[-1]) and out.dtype == q.dtype
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    for g, t in zip(grads, inputs):
        assert g.shape == t.shape and g.dtype == t.dtype
    return out, grads


def child_env(**set_vars: str | None) -> dict[str, str]:
    """The environment of a child Python process a test starts on a script file: this checkout's root first on
    PYTHONPATH (so that it imports the diyflash under test, installed or not: a script's own folder, not the
    working directory, starts its sys.path), and set_vars set (None: removed)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    for name, value in set_vars.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env
