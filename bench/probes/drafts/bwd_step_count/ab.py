"""(issue 48) Whether the Hopper backward's step index costs: the kernel before divided the step count t by a
runtime count (query heads on GQA, or row blocks on a window) with an integer division, ~25 SASS instructions
of a step's ~585 (offline sm_90a); `count` (this tree's kernel) carries the step's (row block, head) from the
step before (backward_sm90._next_step). `div` = the kernel before (backward_sm90_div.py here, the tree's
file at the commit before). One process each, processes in turns; the backward only, FA2 and the deterministic
backward left out.
    python bench/probes/drafts/bwd_step_count/ab.py count|div VARIANT-I OUT.jsonl"""

import importlib.util
import json
import os
import sys

if sys.argv[1] == "div":  # the kernel before in the package's place, before anything imports it
    import diyflash.kernels.attention as package

    name = "diyflash.kernels.attention.backward_sm90"
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__),
                                                                     "backward_sm90_div.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    package.backward_sm90 = module

import bench.cells as cells  # noqa: E402
from bench.common import provenance  # noqa: E402
from diyflash.kernels.attention import hopper  # noqa: E402

variant, run, out = sys.argv[1:4]
assert hasattr(hopper.backward_module(), "_step") == (variant == "div"), variant
names = ["GQA32/8 D128 causal bf16 B4 N4096", "GQA32/8 D128 causal bf16 B1 N16384", "GQA64/8 D128 causal bf16 B1 N16384",
         "MHA D128 causal fp16 B2 H16 N8192", "window4096 GQA32/8 D128 causal bf16 B1 N16384"]
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
                print(f"{variant:5s} bwd {name:46s} {row['tflops']:6.1f} TFLOPS {row['vs_peer']:.3f}x {row['peer']}",
                      flush=True)
