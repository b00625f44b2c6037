"""bench.cells on head_dim-128 causal sliding windows at N16384 (forward), for the win128.diff A/B."""
import sys

import bench.cells as c

c.CELLS.clear()
for w in (256, 512, 1024, 2048):
    c.CELLS[f"window{w} MHA D128 causal bf16 B2 H16 N16384"] = (2, 16, 16, 16384, 128, True, "bf16", w)
c.CELLS["window4096 GQA32/8 D128 causal bf16 B1 N16384"] = (1, 32, 8, 16384, 128, True, "bf16", 4096)
sys.exit(c.main(sys.argv[1:]))
