"""The Hopper forward as built (FMA: the scale folded into exp2's FMA, rows past FMA_MAX_ROW marked with a NaN
lse, and the portable kernel's second pass launched after it, which computes the marked blocks again in the
exact form and returns at once elsewhere) against the same kernel with FMA=False and no second pass (the exact
form throughout: the kernel before), beside cuDNN (FlexAttention on the window), one process, in turns; each
variant keeps its own plans (launch.PLANS swapped; FMA set on the Hopper launch's meta, the second pass
dropped). Errors against float64 on odd shapes first.  PYTHONPATH=$PWD python bench/probes/drafts/fwd_fma_marks.py
"""
import json, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from diyflash.kernels.attention import hopper, launch
from bench.common import compiled_flex, interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
D64 = "--d64" in sys.argv
if D64:
    hopper.use("hopper")
prov = provenance()
rows = []
VARIANTS = {"exact": False, "fma": True}
saved = {}
_Launch = launch.Launch
state = {"fma": True}


def _launch(fn, grid, ptrs, args, meta):
    if "FMA" in meta:
        meta = {**meta, "FMA": meta["FMA"] and state["fma"]}
    return _Launch(fn, grid, ptrs, args, meta)


launch.Launch = _launch
_chunks = launch.launch_chunks


def _launch_chunks(chunks, *a, **kw):  # the exact variant: no second pass
    keep = [(env, [lc for lc in lcs if state["fma"] or lc.meta.get("PASS") != 2]) for env, lcs in chunks]
    return _chunks(keep, *a, **kw)


launch.launch_chunks = _launch_chunks


def variant(var, args, kw):
    def run():
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        state["fma"] = VARIANTS[var]
        got = launch.attention_fwd(*args, **kw)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


for B, H, Hk, Nq, Nk, D, causal, dt in [(2, 8, 2, 1000, 1000, 128, True, torch.bfloat16),
                                        (1, 4, 4, 333, 700, 128, True, torch.float16),
                                        (2, 8, 8, 1111, 1111, 128, False, torch.float16)]:
    torch.manual_seed(0)
    q = torch.randn(B, H, Nq, D, device="cuda", dtype=dt) * 2
    k, v = (torch.randn(B, Hk, Nk, D, device="cuda", dtype=dt) for _ in range(2))
    scale = D ** -0.5
    s = q.double() @ k.double().repeat_interleave(H // Hk, 1).transpose(-1, -2) * scale
    if causal:
        i = torch.arange(Nq, device="cuda")[:, None] + (Nk - Nq)
        s = s.masked_fill(torch.arange(Nk, device="cuda")[None, :] > i, float("-inf"))
    ref = s.softmax(-1) @ v.double().repeat_interleave(H // Hk, 1)
    errs = {}
    for vn in VARIANTS:
        saved.clear()
        out, lse = variant(vn, (q, k, v, causal, scale, None), {})()
        errs[vn] = round((out.double() - ref).abs().max().item(), 6)
    row = {"run": "fma scale with marks, errors", "cell": f"B{B} H{H}/{Hk} Nq{Nq} Nk{Nk} D{D} causal={causal} {dt}",
           "max_err_vs_float64": errs, **prov}
    rows.append(row)
    print(row["cell"], errs, flush=True)
saved.clear()

CELLS = [("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16, -1),
         ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, -1),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16, -1),
         ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16, -1),
         ("MHA D128 full bf16 B4 H32 N4096", 4, 32, 32, 4096, 128, False, torch.bfloat16, -1),
         ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, 4096)]
if D64:
    CELLS = [("MHA D64 full fp16 B2 H16 N8192 (=hopper)", 2, 16, 16, 8192, 64, False, torch.float16, -1),
             ("MHA D64 causal fp16 B2 H16 N8192 (=hopper)", 2, 16, 16, 8192, 64, True, torch.float16, -1),
             ("GQA32/8 D64 causal bf16 B4 N4096 (=hopper)", 4, 32, 8, 4096, 64, True, torch.bfloat16, -1),
             ("MHA D64 causal fp16 B16 H16 N1024 (=hopper)", 16, 16, 16, 1024, 64, True, torch.float16, -1)]
flex = compiled_flex()
for name, B, H, Hk, N, D, causal, dt, w in CELLS:
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H), mk(Hk), mk(Hk)
    scale = D ** -0.5
    fns = {}
    if w < 0:
        fns["cudnn"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    else:
        from torch.nn.attention.flex_attention import create_block_mask
        bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, N, N, device="cuda")
        fns["flex"] = lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)
    kw = {} if w < 0 else {"window": (w, 0)}
    args = (q, k, v, causal, scale, None)
    for vn in VARIANTS:
        fns[vn] = variant(vn, args, kw)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        outs = {kk: fn()[0] if kk in VARIANTS else fn() for kk, fn in fns.items()}
        diff = round((outs["fma"].float() - outs["exact"].float()).abs().max().item(), 5)
        times = interleaved_times(fns, rounds=5, round_ms=60)
    saved.clear()
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    if w >= 0:
        flops = 4 * B * H * D * (N * (w + 1) - w * (w + 1) / 2)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    base = res.get("cudnn", res.get("flex"))
    row = {"run": "fma scale with marks", "cell": name, "tflops": {kk: round(x, 1) for kk, x in res.items()},
           "vs_peer": {kk: round(x / base, 3) for kk, x in res.items()},
           "fma_vs_exact": round(res["fma"] / res["exact"], 3), "max_diff_fma_exact": diff, **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {x:.0f} ({x / base:.3f}x)" for kk, x in res.items()),
          f"fma/exact {res['fma'] / res['exact']:.3f} diff {diff}", flush=True)
with open(os.path.join(OUT, "fwd_fma_marks.jsonl"), "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
