# (issue 48, fwd_turns) bench.cells with three more head_dim-64 cells without masks
import sys, bench.cells as c
c.CELLS.update({
    "MHA D64 full bf16 B4 H32 N4096": (4, 32, 32, 4096, 64, False, "bf16", None),
    "GQA32/8 D64 full bf16 B4 N2048": (4, 32, 8, 2048, 64, False, "bf16", None),
    "MHA D64 full fp16 B1 H16 N16384": (1, 16, 16, 16384, 64, False, "fp16", None),
})
sys.exit(c.main(sys.argv[1:]))
