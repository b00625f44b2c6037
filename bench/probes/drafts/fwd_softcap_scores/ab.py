"""(issue 48) Whether forward_sm90's block-softmax helpers (41f0a94: a softcap build's scores computed once before
the block's mask branch, 10488 SASS lines against 12776 in the D128 window build, offline sm_90a) changed the speed
of the Hopper forward with a softcap: the kernel (`new`) against forward_sm90.py as it was before that commit
(`before`, forward_sm90_before.py here, put in the kernel module's place), one process each, processes in turns.
Each cell is bench.cells' with softcap=30 on diyflash's calls (its peer, cuDNN or FlexAttention, has none: the
ratio only normalizes the machine between processes); a window-256 cell without softcap is the control (its
build did not change).
And (semantics._rcp_fast, 1 / (exp(2x) + 1) in the softcap's tanh by rcp.approx) the kernel against `divfull`:
the same with that reciprocal as Triton's `/` (div.full, as the tanh had it before), patched into semantics.
    CELLS=I,J MODES=fwd,bwd python bench/probes/drafts/fwd_softcap_scores/ab.py new|before|divfull VARIANT-I OUT.jsonl
(CELLS: those of the list below, by index; MODES: fwd by default; the deterministic backward is left out)"""

import functools
import importlib.util
import os
import sys

import diyflash
import diyflash.kernels.attention as attention_pkg
import bench.cells as cells

variant, run, out = sys.argv[1:4]
if variant == "before":
    name = "diyflash.kernels.attention.forward_sm90"
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__),
                                                                      "forward_sm90_before.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    attention_pkg.forward_sm90 = module
if variant == "divfull":  # tanh's 1 / (exp(2x) + 1) as Triton's `/` (div.full) instead of _rcp_fast (rcp.approx)
    import triton

    import diyflash.kernels.attention.semantics as semantics

    @triton.jit
    def _rcp_div(b):
        return 1.0 / b

    semantics._rcp_fast = _rcp_div
plain = diyflash.flash_attention
capped = functools.partial(plain, softcap=30.0)
cells.CELLS.update({"window256 GQA32/8 D128 causal bf16 B1 N16384": (1, 32, 8, 16384, 128, True, "bf16", 256)})
runs = [("softcap30 GQA32/8 D128 causal bf16 B4 N4096", "GQA32/8 D128 causal bf16 B4 N4096", capped),
        ("softcap30 window256 GQA32/8 D128 causal bf16 B1 N16384", "window256 GQA32/8 D128 causal bf16 B1 N16384",
         capped),
        ("window256 GQA32/8 D128 causal bf16 B1 N16384", "window256 GQA32/8 D128 causal bf16 B1 N16384", plain)]
cells.CELLS.update({"MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, True, "fp16", None)})
runs.append(("softcap30 MHA D64 causal fp16 B2 H16 N8192", "MHA D64 causal fp16 B2 H16 N8192", capped))
runs = [runs[int(i)] for i in os.environ["CELLS"].split(",")] if "CELLS" in os.environ else runs
modes = os.environ.get("MODES", "fwd").split(",")
providers = cells.providers


def without_det(name):  # the deterministic backward is not what changed
    found, peer = providers(name)
    return {p: fn for p, fn in found.items() if p != "diyflash-det"}, peer


cells.providers = without_det
import json

from bench.common import provenance

with open(out, "a") as f:
    for label, cell, fn in runs:
        diyflash.flash_attention = fn
        for row in cells.measure(cell, modes):
            row.update(provenance())
            row.update(cell=f"{row['mode']} {label}", variant=variant, run=run)
            f.write(json.dumps(row) + "\n")
            if row["provider"] == "diyflash":
                print(f"{variant:7s} {row['mode']} {label:56s} {row['tflops']:6.1f} TFLOPS {row['vs_peer']:.3f}x {row['peer']}",
                  flush=True)
