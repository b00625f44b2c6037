"""bench.cells on head_dim-64 causal sliding windows at N16384 (forward), for the win64.diff A/B."""
import sys

import bench.cells as c

c.CELLS.clear()
for w in (256, 512, 1024, 2048):
    c.CELLS[f"window{w} MHA D64 causal bf16 B2 H16 N16384"] = (2, 16, 16, 16384, 64, True, "bf16", w)
sys.exit(c.main(sys.argv[1:]))
