"""The Hopper forward at head_dim 64, now in the FMA form with marks and the second pass, against the portable
kernel ("auto" today), beside cuDNN, one process, in turns: three consumers of 128-key blocks in 3 slots (what
`=hopper` runs), two consumers in 2 and in 3 slots. Each variant keeps its own plans (launch.PLANS swapped;
hopper._backend and hopper.TILES[64] set per variant). Errors against float64 on odd shapes first.
PYTHONPATH=$PWD python bench/probes/drafts/fwd_d64_fma.py
"""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from diyflash.kernels.attention import hopper, launch
from bench.common import interleaved_times, quantiles, provenance

OUT = os.environ.get("OUT", "/tmp")
prov = provenance()
rows = []
VARIANTS = {"portable": ("auto", None), "h3c3s": ("hopper", hopper.Tiles(128, 3, 3)),
            "h2c2s": ("hopper", hopper.Tiles(128, 2, 2)), "h2c3s": ("hopper", hopper.Tiles(128, 3, 2))}
saved = {}


def variant(var, args, kw):
    def run():
        backend, tiles = VARIANTS[var]
        hopper._backend = backend
        if tiles is not None:
            hopper.TILES[64] = tiles
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        got = launch.attention_fwd(*args, **kw)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run



for B, H, Hk, Nq, Nk, causal, dt in [(2, 8, 2, 1000, 1000, True, torch.bfloat16),
                                     (1, 4, 4, 333, 700, True, torch.float16),
                                     (2, 8, 8, 1111, 1111, False, torch.float16)]:
    D = 64
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
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out, lse = variant(vn, (q, k, v, causal, scale, None), {})()
            torch.cuda.synchronize()
        names = {e.name for e in prof.events()}
        ran = {kn for kn, tag in (("hopper", "_hopper_fwd_kernel"), ("portable", "_attn_fwd_kernel"))
               if any(tag in n for n in names)}
        assert ran == ({"portable"} if vn == "portable" else {"hopper", "portable"}), (vn, ran)
        errs[vn] = round((out.double() - ref).abs().max().item(), 6)
    row = {"run": "d64 fma, errors", "cell": f"B{B} H{H}/{Hk} Nq{Nq} Nk{Nk} D{D} causal={causal} {dt}",
           "max_err_vs_float64": errs, **prov}
    rows.append(row)
    print(row["cell"], errs, flush=True)
saved.clear()

CELLS = [("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, False, torch.float16),
         ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, True, torch.float16),
         ("GQA32/8 D64 causal bf16 B4 N4096", 4, 32, 8, 4096, True, torch.bfloat16),
         ("GQA32/8 D64 causal bf16 B1 N16384", 1, 32, 8, 16384, True, torch.bfloat16),
         ("MHA D64 full bf16 B4 H32 N4096", 4, 32, 32, 4096, False, torch.bfloat16),
         ("MHA D64 causal fp16 B16 H16 N1024", 16, 16, 16, 1024, True, torch.float16),
         ("MHA D64 full fp16 B16 H16 N1024", 16, 16, 16, 1024, False, torch.float16)]
for name, B, H, Hk, N, causal, dt in CELLS:
    D = 64
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dt)
    q, k, v = mk(H), mk(Hk), mk(Hk)
    scale = D ** -0.5
    fns = {"cudnn": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)}
    args = (q, k, v, causal, scale, None)
    for vn in VARIANTS:
        fns[vn] = variant(vn, args, {})
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        outs = {kk: fn()[0] if kk in VARIANTS else fn() for kk, fn in fns.items()}
        diff = {vn: round((outs[vn].float() - outs["portable"].float()).abs().max().item(), 5) for vn in VARIANTS}
        times = interleaved_times(fns, rounds=5, round_ms=60)
    saved.clear()
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    base = res["cudnn"]
    row = {"run": "d64 fma", "cell": name, "tflops": {kk: round(x, 1) for kk, x in res.items()},
           "vs_peer": {kk: round(x / base, 3) for kk, x in res.items()}, "max_diff_vs_portable": diff, **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {x:.0f} ({x / base:.3f}x)" for kk, x in res.items()), flush=True)
with open(os.path.join(OUT, "fwd_d64_fma.jsonl"), "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
