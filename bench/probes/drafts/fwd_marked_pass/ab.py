# (issue 48) bench.cells' forward with a marked-pass variant (variants.py): python ab.py VARIANT bench.cells-args...
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import variants  # noqa: E402
variants.apply(sys.argv[1])
from bench import cells  # noqa: E402
sys.exit(cells.main(sys.argv[2:]))
