"""bench.cells on the head_dim-128 headline cells without a window (backward), for the s3.diff A/B."""
import sys

import bench.cells as c

for name in list(c.CELLS):
    if "D128" not in name or "window" in name or name.startswith("GQA64"):
        del c.CELLS[name]
sys.exit(c.main(sys.argv[1:]))
