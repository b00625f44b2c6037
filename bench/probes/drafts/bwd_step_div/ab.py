"""(issue 48) Whether the Hopper backward's step index costs: backward_sm90._step divides the step count t by a
runtime count (query heads, or row blocks) with an integer division, about 25 SASS instructions of the MMA
warpgroups' 585 a step at D128 (offline sm_90a); `fdiv` (this commit's kernel) takes the quotient from an fp32
product with the count's reciprocal (exact while t < 2^22): the non-causal D128 step 585 -> 567 instructions,
no spill; the causal build 4 B of spills (0 before). `div` = the integer division patched back. One process
each, processes in turns; the backward only, FA2 and the deterministic backward left out.
    CELLS=I,J python bench/probes/drafts/bwd_step_div/ab.py fdiv|div VARIANT-I OUT.jsonl"""

import json
import os
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import bench.cells as cells
from bench.common import provenance
from diyflash.kernels.attention import hopper

variant, run, out = sys.argv[1:4]
if variant == "div":
    module = hopper.backward_module()

    @gluon.jit
    def _step_div(t, n_blk, lo, head0, heads, BLOCK_M: gl.constexpr, BY_ROW: gl.constexpr):
        if BY_ROW:
            r = t // heads
            g = t - r * heads
            if heads > 1:
                r = n_blk - 1 - r
        else:
            g = t // n_blk
            r = t - g * n_blk
        return lo + r * BLOCK_M, head0 + g

    module._step = _step_div
names = ["MHA D128 full fp16 B2 H16 N8192", "GQA32/8 D128 causal bf16 B4 N4096", "MHA D128 causal fp16 B2 H16 N8192"]
names = [names[int(i)] for i in os.environ["CELLS"].split(",")] if "CELLS" in os.environ else names
providers = cells.providers


def lean(name):
    found, peer = providers(name)
    return {p: fn for p, fn in found.items() if p not in ("diyflash-det", "fa2")}, peer


cells.providers = lean
with open(out, "a") as f:
    for name in names:
        for row in cells.measure(name, ["bwd"]):
            row.update(provenance())
            row.update(variant=variant, run=run, cell=f"bwd {name}")
            f.write(json.dumps(row) + "\n")
            if row["provider"] == "diyflash":
                print(f"{variant:5s} bwd {name:40s} {row['tflops']:6.1f} TFLOPS {row['vs_peer']:.3f}x {row['peer']}",
                      flush=True)
