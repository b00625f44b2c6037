"""A/B: the Hopper backward at head_dim 128 with two dq buffers a warpgroup, each tile handed to the writer under the
next step's first matmuls (this tree: hopper.BWD_TILES[128]'s third field 2), against main (one buffer, the hand-over
right after the store), one process each, each provider right after cuDNN, backward cells."""
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
# the five head_dim-128 headline cells, and MHA D64 full as a control (its kernel is unchanged)
cells = ["MHA D128 full fp16 B2 H16 N8192", "MHA D128 causal fp16 B2 H16 N8192", "GQA32/8 D128 causal bf16 B1 N16384",
         "GQA64/8 D128 causal bf16 B1 N16384", "GQA32/8 D128 causal bf16 B4 N4096", "MHA D64 full fp16 B2 H16 N8192"]
ROUNDS = int(os.environ.get("ROUNDS", "7"))
rows = []
for name in cells:
    b, h, hkv, n, d, causal, dn, _ = CELLS[name]
    q, k, v = inputs(b, h, hkv, n, d, DTYPES[dn], "bhnd")
    fns = {"cudnn": prepare(sdpa(SDPBackend.CUDNN_ATTENTION), q, k, v, causal, "bwd"),
           "diyflash": prepare(lambda q, k, v, c: diyflash.flash_attention(q, k, v, causal=c), q, k, v, causal, "bwd")}
    t = interleaved_times(fns, rounds=ROUNDS, round_ms=50, anchor="cudnn")
    tf = {p: attention_flops(b, h, n, n, d, causal, "bwd") / quantiles(x, (0.5,))[0] / 1e9 for p, x in t.items()}
    rows.append(dict(cell=name, label=label, tflops=tf["diyflash"], cudnn=tf["cudnn"], ratio=tf["diyflash"] / tf["cudnn"]))
    print(f"{label} {name}: {tf['diyflash']:.0f} vs cuDNN {tf['cudnn']:.0f} = {rows[-1]['ratio']:.3f}", flush=True)
with open(out, "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
