# (issue 48, d64_window_route) bench.cells on causal windows of 256-1536 keys at head_dim 64
import sys, bench.cells as c
c.CELLS.clear()
for w in (256, 512, 1024, 1536):
    c.CELLS[f"window{w} MHA D64 causal bf16 B2 H16 N16384"] = (2, 16, 16, 16384, 64, True, "bf16", w)
sys.exit(c.main(sys.argv[1:]))
