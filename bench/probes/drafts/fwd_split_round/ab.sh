#!/bin/bash
# (issue 48) The Hopper forward's last round of tiles cut into runs of key blocks, one a program, merged by a
# second launch (hopper.split, semantics._work, merge.py), against whole tiles in turns: bench.cells' non-causal
# forward cells (where a round of 132 programs is left part full: MHA D128 full B2 H16 N8192 has 2048 tiles,
# 15.52 rounds; D64 full 1376, 10.42), processes base, split, whole, split, base; "whole" is this tree with
# hopper.SPLIT_MIN_GAIN past 1 (no call split: the kernel's cost of carrying the split). The base tree is the
# commit before the split's (git archive c0e9bb8 diyflash csrc_registry bench | tar -x -C DRAFT/base). ncu's SM
# balance bounds the gain at 3.1 % (D128 full) and 5.6 % (D64 full): results/fwd_sm_balance_h200.txt.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
C=("MHA D128 full fp16 B2 H16 N8192" "MHA D64 full fp16 B2 H16 N8192")
one() {
  (cd $2 && PYTHONPATH=$2 timeout 100 python -c "import sys, runpy; import diyflash.kernels.attention.hopper as h; h.SPLIT_MIN_GAIN = float(sys.argv[1]); sys.argv = ['bench.cells'] + sys.argv[2:]; runpy.run_module('bench.cells', run_name='__main__')" $3 --modes fwd --cells "${C[@]}" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1)
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
one base1 $R/DRAFT/base 0.01
one split1 $R 0.01
one whole1 $R 2.0
one split2 $R 0.01
one base2 $R/DRAFT/base 0.01
