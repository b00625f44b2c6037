"""(issue 48) Whether folding the scale and tanh's 2 log2(e) into one factor of the raw dot (semantics._softcap_arg,
_tanh_of: offline sm_90a the D128 causal softcap forward's key loop 2129 -> 1999 SASS instructions, two FMUL a
score fewer) makes softcapped attention faster: the kernels (`new`) against `unfolded`, the form before (s = q.k *
scale rounded on its own, then tanh(s / cap2) with its own 2 log2(e) multiply) patched into semantics, one process
each, processes in turns. Each cell is bench.cells' with softcap=30 on diyflash's calls (its peer, cuDNN or
FlexAttention, has none: the ratio only normalizes the machine between processes).
    CELLS=I,J MODES=fwd,bwd python bench/probes/drafts/fwd_softcap_fold/ab.py new|unfolded VARIANT-I OUT.jsonl
(CELLS: those of the list below, by index; MODES: fwd by default; the deterministic backward is left out)"""

import functools
import json
import os
import sys

import triton
import triton.language as tl

import bench.cells as cells
import diyflash
import diyflash.kernels.attention.semantics as semantics
from bench.common import provenance

variant, run, out = sys.argv[1:4]
if variant == "unfolded":  # _scores' softcap as before the fold (its calls resolve these names at compile time)
    @triton.jit
    def _arg_unfolded(qk_scale, inv_cap2):
        return qk_scale

    @triton.jit
    def _softcap_unfolded(qk, cap2, qk_scale):
        s = semantics._mul_exact(qk, qk_scale)
        x = s * (1.0 / cap2)
        big = 1.0 - 2.0 * semantics._rcp_fast(tl.math.exp2(x * 2.8853900817779268) + 1.0)
        x2 = x * x
        small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
        t = tl.where(tl.abs(x) < 0.125, small, big)
        return semantics._mul_exact(cap2, t), t

    semantics._softcap_arg = _arg_unfolded
    semantics._softcap = _softcap_unfolded
plain = diyflash.flash_attention
capped = functools.partial(plain, softcap=30.0)
cells.CELLS.update({"window256 GQA32/8 D128 causal bf16 B1 N16384": (1, 32, 8, 16384, 128, True, "bf16", 256),
                    "MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, True, "fp16", None)})
runs = [("softcap30 GQA32/8 D128 causal bf16 B4 N4096", "GQA32/8 D128 causal bf16 B4 N4096"),
        ("softcap30 window256 GQA32/8 D128 causal bf16 B1 N16384", "window256 GQA32/8 D128 causal bf16 B1 N16384"),
        ("softcap30 MHA D64 causal fp16 B2 H16 N8192", "MHA D64 causal fp16 B2 H16 N8192")]
runs = [runs[int(i)] for i in os.environ["CELLS"].split(",")] if "CELLS" in os.environ else runs
modes = os.environ.get("MODES", "fwd").split(",")
providers = cells.providers


def without_det(name):  # the deterministic backward is not what changed
    found, peer = providers(name)
    return {p: fn for p, fn in found.items() if p != "diyflash-det"}, peer


cells.providers = without_det
diyflash.flash_attention = capped
with open(out, "a") as f:
    for label, cell in runs:
        for row in cells.measure(cell, modes):
            row.update(provenance())
            row.update(cell=f"{row['mode']} {label}", variant=variant, run=run)
            f.write(json.dumps(row) + "\n")
            if row["provider"] == "diyflash":
                print(f"{variant:8s} {row['mode']} {label:56s} {row['tflops']:6.1f} TFLOPS {row['vs_peer']:.3f}x "
                      f"{row['peer']}", flush=True)
