"""bench.cells on head_dim-64 cells (forward), for the stages.diff A/B."""
import sys

import bench.cells as c

c.CELLS.clear()
c.CELLS.update({
    "MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, True, "fp16", None),
    "MHA D64 causal bf16 B4 H32 N4096": (4, 32, 32, 4096, 64, True, "bf16", None),
    "GQA32/8 D64 causal bf16 B1 N16384": (1, 32, 8, 16384, 64, True, "bf16", None),
    "MHA D64 full fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, False, "fp16", None),
})
sys.exit(c.main(sys.argv[1:]))
