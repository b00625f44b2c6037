# (issue 48, d64_window_route) bench.cells on D64 cells the first run read: a causal one at N4096 and two causal windows
import sys, bench.cells as c
c.CELLS.clear()
c.CELLS.update({
    "MHA D64 causal bf16 B4 H32 N4096": (4, 32, 32, 4096, 64, True, "bf16", None),
    "window2048 MHA D64 causal bf16 B2 H16 N16384": (2, 16, 16, 16384, 64, True, "bf16", 2048),
    "window4096 GQA32/8 D64 causal bf16 B1 N16384": (1, 32, 8, 16384, 64, True, "bf16", 4096),
})
sys.exit(c.main(sys.argv[1:]))
