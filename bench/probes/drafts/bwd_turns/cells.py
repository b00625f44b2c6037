"""bench.cells on the headline cells but GQA 64/8 (backward), for the turns.diff A/B."""
import sys

import bench.cells as c

for name in list(c.CELLS):
    if name.startswith("GQA64"):
        del c.CELLS[name]
sys.exit(c.main(sys.argv[1:]))
