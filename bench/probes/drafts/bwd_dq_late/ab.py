"""A/B: the Hopper backward handing each dq tile to the writer under the next step's first matmuls (this tree) against the tree before (.devsite/base_tree),
one process each, each provider right after cuDNN, backward cells."""
import json, os, sys, time
tree = sys.argv[1]; label = sys.argv[2]; out = sys.argv[3]
sys.path.insert(0, tree)
import torch
import diyflash
assert diyflash.__file__.startswith(os.path.abspath(tree)), diyflash.__file__
sys.path.insert(0, os.getcwd())
from bench.attention import inputs, prepare, sdpa
from bench.cells import CELLS, attention_flops
from bench.common import DTYPES, interleaved_times, quantiles
from torch.nn.attention import SDPBackend
# the headline cells by default; D64=1: the head_dim-64 causal cells (the 64-row tile, two dq buffers a warpgroup)
# and the non-causal one (the 128-row tile, one buffer: its kernel is unchanged, a control)
cells = ["MHA D128 full fp16 B2 H16 N8192", "MHA D128 causal fp16 B2 H16 N8192", "GQA32/8 D128 causal bf16 B1 N16384",
         "GQA64/8 D128 causal bf16 B1 N16384", "GQA32/8 D128 causal bf16 B4 N4096", "MHA D64 full fp16 B2 H16 N8192",
         "MHA D64 causal fp16 B2 H16 N8192"]
if os.environ.get("D64"):
    CELLS = dict(CELLS)
    CELLS["GQA32/8 D64 causal bf16 B4 N4096"] = (4, 32, 8, 4096, 64, True, "bf16", None)
    CELLS["GQA32/8 D64 causal bf16 B1 N16384"] = (1, 32, 8, 16384, 64, True, "bf16", None)
    cells = ["MHA D64 causal fp16 B2 H16 N8192", "GQA32/8 D64 causal bf16 B4 N4096", "GQA32/8 D64 causal bf16 B1 N16384",
             "MHA D64 full fp16 B2 H16 N8192"]
rows = []
for name in cells:
    b, h, hkv, n, d, causal, dn, _ = CELLS[name]
    q, k, v = inputs(b, h, hkv, n, d, DTYPES[dn], "bhnd")
    fns = {"cudnn": prepare(sdpa(SDPBackend.CUDNN_ATTENTION), q, k, v, causal, "bwd"),
           "diyflash": prepare(lambda q, k, v, c: diyflash.flash_attention(q, k, v, causal=c), q, k, v, causal, "bwd")}
    t = interleaved_times(fns, rounds=7, round_ms=50, anchor="cudnn")
    tf = {p: attention_flops(b, h, n, n, d, causal, "bwd") / quantiles(x, (0.5,))[0] / 1e9 for p, x in t.items()}
    rows.append(dict(cell=name, label=label, tflops=tf["diyflash"], cudnn=tf["cudnn"], ratio=tf["diyflash"] / tf["cudnn"]))
    print(f"{label} {name}: {tf['diyflash']:.0f} vs cuDNN {tf['cudnn']:.0f} = {rows[-1]['ratio']:.3f}", flush=True)
with open(out, "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
