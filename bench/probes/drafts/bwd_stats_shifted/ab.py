"""(issue 48) Whether the Hopper backward gains from stats stored shifted: the preprocess stores -lse2 / qk_rest
and -delta (semantics._stats_shifted), so that each step's s^T and dp^T tiles start from the loaded rows with no
arithmetic (offline sm_90a: the MHA D128 step 546/553 -> 513/520 SASS instructions a consumer, the GQA causal
build's 4 B of spills gone, the D64 wide step 960/918 -> 895/849). `shift` = this tree; `head` = the tree before,
a checkout of 695b973 first on PYTHONPATH (ab.sh). One process each, processes in turns; the backward only,
FA2 and the deterministic backward left out.
    python bench/probes/drafts/bwd_stats_shifted/ab.py shift|head VARIANT-I OUT.jsonl"""

import json
import sys

import bench.cells as cells
import diyflash
from bench.common import provenance
from diyflash.kernels.attention import backward_rows

variant, run, out = sys.argv[1:4]
shifted = "SHIFTED" in backward_rows._attn_bwd_preprocess_kernel.arg_names
assert shifted == (variant == "shift"), (variant, diyflash.__file__)
names = ["MHA D128 full fp16 B2 H16 N8192", "GQA32/8 D128 causal bf16 B4 N4096", "GQA64/8 D128 causal bf16 B1 N16384",
         "MHA D64 full fp16 B2 H16 N8192", "MHA D128 causal fp16 B2 H16 N8192"]
providers = cells.providers


def lean(name):
    found, peer = providers(name)
    return {p: fn for p, fn in found.items() if p not in ("diyflash-det", "fa2")}, peer


cells.providers = lean
with open(out, "a") as f:
    for name in names:
        for row in cells.measure(name, ["bwd"]):
            row.update(provenance())
            row.update(variant=variant, run=run, cell=name)
            f.write(json.dumps(row) + "\n")
            if row["provider"] == "diyflash":
                print(f"{variant:5s} bwd {name:40s} {row['tflops']:6.1f} TFLOPS {row['vs_peer']:.3f}x {row['peer']}",
                      flush=True)
