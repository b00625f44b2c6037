#!/bin/bash
# (issue 48) the Hopper forward with its softmax row sum kept per quad lane (lanes.diff) against the kernel, as run:
# the base tree unpacked by `git archive 697f4c9 diyflash csrc_registry | tar -x -C DRAFT/base` (bench/ copied
# beside it), the patched one at the repository root; bench.cells forward cells, processes base, lanes, lanes, base.
echo "new tree has _row_parts: $(grep -c _row_parts diyflash/kernels/attention/forward_sm90.py); base: $(grep -c _row_parts DRAFT/base/diyflash/kernels/attention/forward_sm90.py)"
R=$PWD
one() {  # $1 label, $2 dir
  (cd $2 && python -m bench.cells --modes fwd --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1)
  echo "== $1"; grep '^| ' $OUT/$1.txt | head -9
}
one base1 $R/DRAFT/base
one new1 $R
one new2 $R
one base2 $R/DRAFT/base
