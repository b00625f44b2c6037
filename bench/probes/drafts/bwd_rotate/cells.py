"""bench.cells on the non-causal headline cells and two more (backward), for the rotate.diff A/B."""
import sys

import bench.cells as c

c.CELLS["GQA32/8 D128 full bf16 B1 N16384"] = (1, 32, 8, 16384, 128, False, "bf16", None)
c.CELLS["MHA D128 full bf16 B4 H32 N4096"] = (4, 32, 32, 4096, 128, False, "bf16", None)
for name in list(c.CELLS):
    if "full" not in name:
        del c.CELLS[name]
sys.exit(c.main(sys.argv[1:]))
