#!/bin/bash
# (issue 48) hopper.Tiles.serial on the head_dim-64 masked calls the headline cells do not hold: processes
# serial (the kernel), off (SERIAL forced off through Tiles.meta), off, serial; forward cells beside cuDNN (the
# windows beside FlexAttention): bf16 MHA causal B4 H32 N4096, GQA 32/8 causal B1 N16384, causal windows of 256
# and 2048 keys (WINDOW_TILES) at B1 H16 N16384, and the headline MHA D64 causal fp16 cell.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
one() {
  timeout 200 python -c "
import sys, runpy
from diyflash.kernels.attention import hopper
import bench.cells as cells
if sys.argv[1] == 'off':
    meta = hopper.Tiles.meta
    hopper.Tiles.meta = lambda self, n_k, banded: dict(meta(self, n_k, banded), SERIAL=False)
cells.CELLS.update({'MHA D64 causal bf16 B4 H32 N4096': (4, 32, 32, 4096, 64, True, 'bf16', None),
                    'GQA32/8 D64 causal bf16 B1 N16384': (1, 32, 8, 16384, 64, True, 'bf16', None),
                    'window256 MHA16 D64 causal fp16 B1 N16384': (1, 16, 16, 16384, 64, True, 'fp16', 256),
                    'window2048 MHA16 D64 causal fp16 B1 N16384': (1, 16, 16, 16384, 64, True, 'fp16', 2048)})
sys.exit(cells.main(sys.argv[2:]))" $2 --modes fwd --cells "MHA D64 causal fp16 B2 H16 N8192" \
    "MHA D64 causal bf16 B4 H32 N4096" "GQA32/8 D64 causal bf16 B1 N16384" "window256 MHA16 D64 causal fp16 B1 N16384" \
    "window2048 MHA16 D64 causal fp16 B1 N16384" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
i=0
for v in ${RUNS:-serial off off serial}; do i=$((i+1)); one $v-$i $v; done
