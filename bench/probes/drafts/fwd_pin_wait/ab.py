"""(issue 48) Whether the Hopper forward's softmax runs under its own p @ v once the p @ v wait is pinned after
the block's row sums (forward_sm90._pin_wait: a `wgmma.wait_group 0` predicated on the row sum's bits, so that
ptxas cannot hoist it to the row max; offline sm_90a, MHA D128 fp16 full: every exp2 before the wait, 490 SASS
instructions against 478, no spill, no serialization): the kernel (`pin`) against `base`, _pin_wait made a no-op
(ptxas then hoists Triton's own wait as before), one process each, processes in turns. Forward only; FA2 and the
deterministic backward left out.
    CELLS=I,J python bench/probes/drafts/fwd_pin_wait/ab.py pin|base VARIANT-I OUT.jsonl"""

import json
import os
import sys

from triton.experimental import gluon

import bench.cells as cells
from bench.common import provenance
from diyflash.kernels.attention import hopper

variant, run, out = sys.argv[1:4]
if variant == "base":
    module = hopper.kernel_module()

    @gluon.jit
    def _no_pin(x):
        pass

    module._pin_wait = _no_pin
names = ["MHA D128 full fp16 B2 H16 N8192", "GQA32/8 D128 causal bf16 B4 N4096", "MHA D64 full fp16 B2 H16 N8192",
         "MHA D128 causal fp16 B2 H16 N8192"]
names = [names[int(i)] for i in os.environ["CELLS"].split(",")] if "CELLS" in os.environ else names
providers = cells.providers


def lean(name):
    found, peer = providers(name)
    return {p: fn for p, fn in found.items() if p not in ("diyflash-det", "fa2")}, peer


cells.providers = lean
with open(out, "a") as f:
    for name in names:
        for row in cells.measure(name, ["fwd"]):
            row.update(provenance())
            row.update(variant=variant, run=run)
            f.write(json.dumps(row) + "\n")
            if row["provider"] == "diyflash":
                print(f"{variant:5s} fwd {name:40s} {row['tflops']:6.1f} TFLOPS {row['vs_peer']:.3f}x {row['peer']}",
                      flush=True)
