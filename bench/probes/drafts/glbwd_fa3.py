"""Device probe: the draft FA3-split Gluon backward (backward_fa3.py), checked against float64 (the 2x rule),
timed beside cuDNN (SDPA), FlexAttention on the window cell and diyflash's own backward. Run from the
repository root with the drafts beside it: python probe_dir/glbwd_fa3.py [check|bench|all]."""
import json, math, os, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton
import diyflash
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diyflash.reference import attention_ref
from diyflash.kernels.attention.plans import host_descriptor
from diyflash.kernels.attention.launch import head_group
import backward_fa3 as backward_sm90
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


def dq_desc(dq):
    return TensorDescriptor(dq, list(dq.shape), list(dq.stride()), [1, 1, BM, 32],
                            gl.NVMMASharedLayout.get_default_for([1, 1, BM, 32], gl.float32))


def stat_desc(t):
    return TensorDescriptor(t, [t.numel()], [1], [BM], gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1))
from bench.common import interleaved_times, quantiles, attention_flops

LOG2E = 1.4426950408889634
OUT = os.environ.get("OUT", "/tmp")
BM, BN = 64, 128
STAGES = int(os.environ.get("STAGES", 3))
SEEN = set()
DEFAULT = dict(DQ_PAD=0, DQ_BUFS=2, DQ_MODE=3)
VARIANTS = {'fa3_pad': dict(DQ_PAD=8, DQ_BUFS=1, DQ_MODE=0), 'fa3_tma1': dict(DQ_BUFS=1), 'fa3_tma2': {},
            'fa3_noadd': dict(DQ_PAD=8, DQ_BUFS=1, DQ_MODE=1)}


def prep(out, dout, lse):
    """delta and base-2 lse, each head's rows padded to a multiple of 4 (16-byte aligned TMA coordinates)."""
    n = lse.shape[-1]
    pad = (n + 3) // 4 * 4
    delta = torch.zeros(*lse.shape[:-1], pad, device=lse.device)
    lse2 = torch.zeros(*lse.shape[:-1], pad, device=lse.device)
    delta[..., :n] = (out.float() * dout.float()).sum(-1)
    lse2[..., :n] = torch.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    return delta, lse2


def gl_bwd_kernel(q, k, v, dout, delta, lse2, dq_acc, dk, dv, causal, window=(-1, -1), softcap=0.0, hg=None,
                  stages=2, **variant):
    B, H, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D)
    big = Nq + Nk
    left, right = window
    win = window != (-1, -1)
    wl = left if left >= 0 else big
    wr = 0 if causal else (right if right >= 0 else big)
    tiles = triton.cdiv(Nk, BN)
    hg = hg or head_group(causal, tiles, B * Hk, q.device)
    ck = backward_sm90._hopper_bwd_kernel[(tiles, Hk, B)](
        host_descriptor(k, BN, D, gluon=True), host_descriptor(v, BN, D, gluon=True),
        host_descriptor(q, BM, D, gluon=True), host_descriptor(dout, BM, D, gluon=True), stat_desc(lse2),
        stat_desc(delta), dq_desc(dq_acc), dq_acc, dk, dv, *dq_acc.stride()[:3], *dk.stride(), *dv.stride(),
        H, Nq, Nk, scale * LOG2E, scale, hg, H // Hk, wl, wr, softcap * LOG2E, lse2.shape[-1],
        HEAD_DIM=D, CAUSAL=causal, WINDOW=win, SOFTCAP=softcap > 0, BLOCK_M=BM, STAGES=stages, MMA_REGS=240,
        num_warps=4, **{**DEFAULT, **variant})
    key = (causal, win, q.dtype, tuple(sorted(variant.items())))
    if key not in SEEN:
        SEEN.add(key)
        print(f"compiled {key}: regs {ck.n_regs} spills {ck.n_spills} "
              f"shared {ck.metadata.shared}", flush=True)


def gl_bwd(q, k, v, out, lse, dout, causal, window=(-1, -1), softcap=0.0, **kw):
    delta, lse2 = prep(out, dout, lse)
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    gl_bwd_kernel(q, k, v, dout, delta, lse2, dq_acc, dk, dv, causal, window, softcap, **kw)
    return dq_acc.to(q.dtype), dk, dv


def grads(fn, q, k, v, dout):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    return torch.autograd.grad(o, (q, k, v), dout)


def check():
    rows = []
    cases = [
        dict(B=2, H=4, Hk=2, Nq=1000, Nk=1000, D=128, causal=True),
        dict(B=2, H=4, Hk=2, Nq=1024, Nk=1024, D=128, causal=False),
        dict(B=1, H=8, Hk=1, Nq=300, Nk=1000, D=128, causal=True),
        dict(B=1, H=2, Hk=2, Nq=1023, Nk=300, D=128, causal=True),
        dict(B=1, H=4, Hk=1, Nq=1500, Nk=1500, D=128, causal=True, window=(256, 0), softcap=30.0),
        dict(B=1, H=4, Hk=1, Nq=17, Nk=113, D=128, causal=False, window=(20, 7)),
        dict(B=2, H=4, Hk=4, Nq=777, Nk=777, D=64, causal=True),
        dict(B=1, H=4, Hk=4, Nq=1, Nk=1, D=128, causal=False),
    ]
    for dtype in (torch.bfloat16, torch.float16):
        for c in cases:
            if c["D"] != 128 and os.environ.get("D64") is None:
                continue
            g = torch.Generator(device="cuda").manual_seed(1)
            mk = lambda h, n: torch.randn(c["B"], h, n, c["D"], device="cuda", dtype=dtype, generator=g)
            q, k, v, dout = mk(c["H"], c["Nq"]), mk(c["Hk"], c["Nk"]), mk(c["Hk"], c["Nk"]), mk(c["H"], c["Nq"])
            kw = dict(causal=c["causal"], window_size=c.get("window", (-1, -1)), softcap=c.get("softcap", 0.0))
            ref = grads(lambda a, b, cc: attention_ref(a, b, cc, **kw)[0], q.double(), k.double(), v.double(), dout.double())
            pt = grads(lambda a, b, cc: attention_ref(a, b, cc, upcast=False, **kw)[0], q, k, v, dout)
            ours = grads(lambda a, b, cc: diyflash.flash_attention(a, b, cc, **kw), q, k, v, dout)
            out, lse = diyflash.flash_attention(q, k, v, return_lse=True, **kw)
            for ov, dve in ((False, False),):
                print(f"case {str(dtype)[6:]} {c}", flush=True)
                gl = gl_bwd(q, k, v, out, lse, dout, c["causal"], kw["window_size"], kw["softcap"])
                torch.cuda.synchronize()
                e = lambda x, r: (x.double() - r).abs().max().item()
                errs = {n: (e(gl[i], ref[i]), e(pt[i], ref[i]), e(ours[i], ref[i])) for i, n in enumerate("qkv")}
                ok = all(a <= 2 * b + 1e-3 * max(1.0, ref[i].abs().max().item()) for i, (a, b, _) in enumerate(errs.values()))
                ok = ok and not any(x.isnan().any() for x in gl)
                rows.append(dict(case=c, dtype=str(dtype), overlap=ov, dv_early=dve, errs=errs, ok=ok))
                print(f"check {str(dtype)[6:]} ov={ov} dve={dve} {c}: " + " ".join(f"d{n} {a:.1e}/{b:.1e}/{t:.1e}" for n, (a, b, t) in errs.items())
                      + (" OK" if ok else " FAIL"), flush=True)
    return rows


CELLS = [
    ("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16, (-1, -1)),
    ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, (-1, -1)),
    ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16, (-1, -1)),
    ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16, (-1, -1)),
    ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, (4096, 0)),
]


def bench():
    rows = []
    for name, B, H, Hk, N, D, causal, dtype, window in CELLS:
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dtype, generator=g)
        q, k, v, dout = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_(), mk(H)
        fns = {}
        if window == (-1, -1):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o_c = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hk)
            fns["cudnn"] = lambda: torch.autograd.grad(o_c, (q, k, v), dout, retain_graph=True)
        else:
            from bench.common import compiled_flex
            from torch.nn.attention.flex_attention import create_block_mask
            flex, w = compiled_flex(), window[0]
            bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, N, N, device="cuda")
            o_f = flex(q, k, v, block_mask=bm, enable_gqa=True)
            fns["flex"] = lambda: torch.autograd.grad(o_f, (q, k, v), dout, retain_graph=True)
        o_d = diyflash.flash_attention(q, k, v, causal=causal, window_size=window)
        fns["diyflash"] = lambda: torch.autograd.grad(o_d, (q, k, v), dout, retain_graph=True)
        with torch.no_grad():
            out, lse = diyflash.flash_attention(q, k, v, causal=causal, window_size=window, return_lse=True)
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        fns["gl"] = lambda: gl_bwd(qd, kd, vd, out, lse, dout, causal, window)
        delta, lse2 = prep(out, dout, lse)
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        dk, dv = torch.empty_like(kd), torch.empty_like(vd)
        for vn, var in VARIANTS.items():
            fns[vn] = lambda var=var: gl_bwd_kernel(qd, kd, vd, dout, delta, lse2, dq_acc, dk, dv, causal, window, **var)
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        times = interleaved_times(fns, rounds=3, round_ms=60)
        flops = attention_flops(B, H, N, N, D, causal, "bwd")
        if window != (-1, -1):
            w = window[0]
            flops = 2.5 * 4 * B * H * D * (N * (w + 1) - w * (w + 1) / 2)
        res = {n: flops / quantiles(t, (0.5,))[0] / 1e9 for n, t in times.items()}
        base = res.get("cudnn", res.get("flex"))
        print(f"{name}: " + "  ".join(f"{n} {tf:.0f} ({tf / base:.2f}x)" for n, tf in res.items()), flush=True)
        rows.append(dict(cell=name, tflops=res))
    return rows


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "BM": BM, "BN": BN}
    t0 = time.time()
    if what in ("all", "bench"):
        out["bench"] = bench()
        print(f"bench done {time.time() - t0:.0f}s", flush=True)
        json.dump(out, open(os.path.join(OUT, f"glbwd_fa3_{what}.json"), "w"), indent=1, default=str)
    if what in ("all", "check"):
        out["check"] = check()
        print("checks ok:", sum(r["ok"] for r in out["check"]), "/", len(out["check"]), f"{time.time() - t0:.0f}s", flush=True)
    json.dump(out, open(os.path.join(OUT, f"glbwd_fa3_{what}.json"), "w"), indent=1, default=str)
