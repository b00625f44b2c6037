"""bench.cells on head_dim-64 causal calls without a window (and one full), forward, for the bn64.diff A/B."""
import sys

import bench.cells as c

keep = ("MHA D64 causal fp16 B2 H16 N8192", "MHA D64 full fp16 B2 H16 N8192")
for name in list(c.CELLS):
    if name not in keep:
        del c.CELLS[name]
c.CELLS["GQA32/8 D64 causal bf16 B1 N16384"] = (1, 32, 8, 16384, 64, True, "bf16", None)
c.CELLS["MHA D64 causal bf16 B4 H16 N4096"] = (4, 16, 16, 4096, 64, True, "bf16", None)
sys.exit(c.main(sys.argv[1:]))
