"""The Hopper forward with each tile's rows stored under the next tile's first q.k^T ("held": two query slots a
consumer, the rows going out through the slot their queries came in by) against the kernel before ("base":
one query slot, a shared output buffer a consumer, the rows stored before the next tile starts), beside cuDNN
(FlexAttention on the window), one process, in turns. At head_dim 64 also the portable kernel and the held
kernel with two consumers ("held_c2"), on rows of 1024-4096 keys ("auto" takes the Hopper kernel from 3072).
Each variant keeps its own plans (launch.PLANS swapped; the base kernel's launcher set per variant).
BASE=<the kernel before, `git show a83fdaf:diyflash/kernels/attention/forward_sm90.py`> PYTHONPATH=$PWD \
    python bench/probes/drafts/fwd_held_rows.py
"""
import importlib.util
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import compiled_flex, interleaved_times, provenance, quantiles
from diyflash.kernels._launch import DirectLauncher
from diyflash.kernels.attention import hopper, launch

OUT = os.environ.get("OUT", "/tmp")
spec = importlib.util.spec_from_file_location("diyflash.kernels.attention.forward_sm90_base", os.environ["BASE"])
base_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base_module)
hopper.use("hopper")
LAUNCHERS = {"held": hopper.launcher(), "base": DirectLauncher(base_module._hopper_fwd_kernel)}
C3, C2 = hopper.Tiles(128, 3, 3), hopper.Tiles(128, 2, 2)
# variant: (backend, kernel, D64 tiles)
VARIANTS = {"base": ("hopper", "base", C3), "held": ("hopper", "held", C3), "portable": ("portable", "held", C3),
            "held_c2": ("hopper", "held", C2)}
prov = provenance()
rows = []
saved = {}


def variant(var, args, kw):
    def run():
        backend, kernel, d64 = VARIANTS[var]
        hopper._backend = backend
        hopper.LAUNCHERS["_hopper_fwd_kernel"] = LAUNCHERS[kernel]
        hopper.TILES[64] = d64
        launch.PLANS.clear()
        launch.PLANS.update(saved.get(var, {}))
        got = launch.attention_fwd(*args, **kw)
        if var not in saved:
            saved[var] = dict(launch.PLANS)
        return got
    return run


# odd shapes against float64, and held == base bit for bit (rows of no key: Nq > Nk causal)
for B, H, Hk, Nq, Nk, D, causal, dt in [(2, 8, 2, 1000, 1000, 128, True, torch.bfloat16),
                                        (1, 4, 4, 1000, 333, 128, True, torch.float16),
                                        (1, 4, 4, 333, 700, 64, True, torch.float16),
                                        (2, 8, 8, 1111, 1111, 64, False, torch.bfloat16),
                                        (3, 4, 4, 77, 4097, 128, False, torch.float16)]:
    torch.manual_seed(0)
    q = torch.randn(B, H, Nq, D, device="cuda", dtype=dt) * 2
    k, v = (torch.randn(B, Hk, Nk, D, device="cuda", dtype=dt) for _ in range(2))
    scale = D ** -0.5
    s = q.double() @ k.double().repeat_interleave(H // Hk, 1).transpose(-1, -2) * scale
    if causal:
        i = torch.arange(Nq, device="cuda")[:, None] + (Nk - Nq)
        s = s.masked_fill(torch.arange(Nk, device="cuda")[None, :] > i, float("-inf"))
    ref = torch.nan_to_num(s.softmax(-1)) @ v.double().repeat_interleave(H // Hk, 1)
    outs = {}
    for vn in ("base", "held", "portable") + (("held_c2",) if D == 64 else ()):
        saved.clear()
        outs[vn] = variant(vn, (q, k, v, causal, scale, None), {})()
    errs = {vn: round((o.double() - ref).abs().max().item(), 6) for vn, (o, _l) in outs.items()}
    same = torch.equal(outs["held"][0], outs["base"][0]) and torch.equal(outs["held"][1], outs["base"][1])
    assert same, errs
    assert not torch.isnan(outs["held"][0]).any()
    row = {"run": "held rows, errors", "cell": f"B{B} H{H}/{Hk} Nq{Nq} Nk{Nk} D{D} causal={causal} {dt}",
           "max_err_vs_float64": errs, "held_equals_base": same, **prov}
    rows.append(row)
    print(row["cell"], errs, "held == base", same, flush=True)
saved.clear()

flex = compiled_flex()
CELLS = [("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16, -1),
         ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, -1),
         ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16, -1),
         ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16, -1),
         ("MHA D128 full bf16 B4 H32 N4096", 4, 32, 32, 4096, 128, False, torch.bfloat16, -1),
         ("window4096 GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16, 4096),
         ("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16, -1),
         ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16, -1),
         ("GQA32/8 D64 causal bf16 B4 N4096 (2048 keys a row)", 4, 32, 8, 4096, 64, True, torch.bfloat16, -1),
         ("MHA D64 full fp16 B8 H16 N2048 (2048)", 8, 16, 16, 2048, 64, False, torch.float16, -1),
         ("MHA D64 causal fp16 B8 H16 N2048 (1024)", 8, 16, 16, 2048, 64, True, torch.float16, -1)]
ONLY = os.environ.get("CELLS")
for name, B, H, Hk, N, D, causal, dt, w in CELLS:
    if ONLY and not any(c in name for c in ONLY.split(",")):
        continue
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
    for vn in ("base", "held") + (("portable", "held_c2") if D == 64 else ()):
        fns[vn] = variant(vn, args, kw)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        outs = {kk: fn()[0] if kk in VARIANTS else fn() for kk, fn in fns.items()}
        assert torch.equal(outs["held"], outs["base"])
        times = interleaved_times(fns, rounds=5, round_ms=60)
    saved.clear()
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    if w >= 0:
        flops = 4 * B * H * D * (N * (w + 1) - w * (w + 1) / 2)
    res = {kk: flops / quantiles(t, (0.5,))[0] / 1e9 for kk, t in times.items()}
    peer = res.get("cudnn", res.get("flex"))
    row = {"run": "held rows", "cell": name, "tflops": {kk: round(x, 1) for kk, x in res.items()},
           "vs_peer": {kk: round(x / peer, 3) for kk, x in res.items()},
           "held_vs_base": round(res["held"] / res["base"], 3), **prov}
    rows.append(row)
    print(name, " ".join(f"{kk} {x:.0f} ({x / peer:.3f}x)" for kk, x in res.items()),
          f"held/base {res['held'] / res['base']:.3f}", flush=True)
with open(os.path.join(OUT, "fwd_held_rows.jsonl"), "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
