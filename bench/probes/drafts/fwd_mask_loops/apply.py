"""Write the probe module: diyflash/kernels/attention/forward_sm90.py with loops.patch applied (a unified diff; no
`patch` tool needed). python apply.py OUT_PATH"""
import re
import sys
from pathlib import Path

here = Path(__file__).parent
src = (here.parents[3] / "diyflash/kernels/attention/forward_sm90.py").read_text().splitlines(keepends=True)
diff = (here / "loops.patch").read_text().splitlines(keepends=True)
out, at, k = [], 0, 0
while k < len(diff):
    m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", diff[k])
    k += 1
    if not m:
        continue
    start = int(m.group(1)) - 1
    out += src[at:start]
    at = start
    while k < len(diff) and not diff[k].startswith("@@"):
        line = diff[k]
        if line.startswith(" ") or line.startswith("-"):
            assert src[at] == line[1:], (at, src[at], line)  # the patch's base is this tree's kernel
            at += 1
        if line.startswith(" ") or line.startswith("+"):
            out.append(line[1:])
        k += 1
out += src[at:]
Path(sys.argv[1]).write_text("".join(out))
