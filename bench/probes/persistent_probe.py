"""Probe: the persistent Hopper forward (a program per SM taking tiles in turns, hopper.schedule) against the
kernel before it (one program a tile: BASE_REV's tree, imported as the package `dfbase` from $BASE_DIR, which
holds `git archive BASE_REV` with an empty dfbase/__init__.py), beside cuDNN (SDPA), FlexAttention on the
window cell and, at D64, the portable kernel; one process, interleaved turns, each kernel through its
tree's kernels.attention.attention_fwd ($NAME and $BASE_NAME name them; CELLS=bf16 runs the bf16 cells
only, CELLS=d128 the head_dim 128 ones). Rows to $OUT/persistent.jsonl."""
import importlib
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.attention import _inputs
from bench.attention_variants import _flex, visible_pairs
from bench.common import attention_flops, interleaved_times, provenance, quantiles
from diyflash.kernels.attention import hopper, launch as ka
from diyflash.kernels.attention_configs import fwd_config

sys.path.insert(0, os.environ["BASE_DIR"])
old_hopper = importlib.import_module("dfbase.kernels.attention.hopper")
old_ka = importlib.import_module("dfbase.kernels.attention.launch")
hopper.use("hopper")  # D64 too (auto keeps it portable); D128 runs it either way
old_hopper.use("hopper")


def sdpa(b):
    def run(q, k, v, causal, window):
        with sdpa_kernel(b):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return run


def tree(module, **kw):
    def run(q, k, v, causal, window):
        return module.attention_fwd(q, k, v, causal, q.shape[-1] ** -0.5, None, window=window, **kw)[0]
    return run


CELLS = [  # (B, H, H_kv, N, D, dtype, causal, window)
    (4, 32, 8, 4096, 128, torch.bfloat16, True, (-1, -1)), (1, 32, 8, 16384, 128, torch.bfloat16, True, (-1, -1)),
    (2, 16, 16, 8192, 64, torch.float16, False, (-1, -1)), (2, 16, 16, 8192, 64, torch.float16, True, (-1, -1)),
    (2, 16, 16, 8192, 128, torch.float16, False, (-1, -1)), (2, 16, 16, 8192, 128, torch.float16, True, (-1, -1)),
    (1, 32, 8, 16384, 128, torch.bfloat16, True, (4095, -1)),
    (4, 32, 8, 4096, 64, torch.bfloat16, True, (-1, -1)), (16, 16, 16, 1024, 64, torch.float16, False, (-1, -1)),
]
if os.environ.get("CELLS") == "bf16":
    CELLS = [c for c in CELLS if c[5] == torch.bfloat16]
elif os.environ.get("CELLS") == "d128":
    CELLS = [c for c in CELLS if c[4] == 128]
prov = provenance()
rows = []
flex = _flex()
for b, h, hkv, n, d, dtype, causal, window in CELLS:
    q, k, v = _inputs(b, h, hkv, n, d, dtype, "bhnd")
    fns = {os.environ.get("NAME", "persistent"): tree(ka), os.environ.get("BASE_NAME", "grid"): tree(old_ka)}
    if d == 64:
        fns["portable"] = tree(ka, config=fwd_config(d, dtype, q.device, causal, False, n))
    if window == (-1, -1):
        fns = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), **fns}
        fl = attention_flops(b, h, n, n, d, causal, "fwd")
    else:
        cell = dict(n=n, window=window, causal=causal, softcap=0.0)
        fns = {"flex": lambda q, k, v, causal, window: flex(q, k, v, cell, None), **fns}
        fl = 4 * b * h * d * visible_pairs(n, n, causal, window)
    first = next(iter(fns))
    ref = fns[first](q, k, v, causal, window)
    benches = {}
    for name, fn in fns.items():
        o = fn(q, k, v, causal, window)
        torch.cuda.synchronize()
        print(f"  check {name}: max|diff vs {first}| {(o.float() - ref.float()).abs().max().item():.3g}", flush=True)
        benches[name] = (lambda fn=fn: fn(q, k, v, causal, window))
    times = interleaved_times(benches, rounds=5, round_ms=50)
    med = {nm: quantiles(t)[0] for nm, t in times.items()}
    kind = "MHA" if hkv == h else f"GQA{h}/{hkv}"
    label = f"{kind} D{d} {'causal' if causal else 'full'} {str(dtype)[6:]} B{b} H{h} N{n}"
    if window != (-1, -1):
        label = f"window{window[0] + 1} " + label
    print(label + ": " + " ".join(f"{nm} {fl / m / 1e9:.0f} ({med[first] / m:.2f}x)" for nm, m in med.items()),
          flush=True)
    rows.append(dict(cell=label, tflops={nm: round(fl / m / 1e9, 1) for nm, m in med.items()}, **prov))
with open(os.environ.get("OUT", "/tmp") + "/persistent.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
