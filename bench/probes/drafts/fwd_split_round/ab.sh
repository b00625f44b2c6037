#!/bin/bash
# (issue 48) The Hopper forward's last round of tiles cut into runs of key blocks, one a program, merged by a
# second launch (hopper.split, semantics._work, merge.py), against whole tiles in turns: bench.cells' non-causal
# forward cells (where a round of 132 programs is left part full: MHA D128 full B2 H16 N8192 has 2048 tiles,
# 15.52 rounds; D64 full 1376, 10.42), processes base, split, split, base. The base tree is the commit before
# (git archive HEAD~ diyflash csrc_registry bench into DRAFT/base). ncu's SM balance bounds the gain at 3.1 % (D128
# full) and 5.6 % (D64 full): results/fwd_sm_balance_h200.txt.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
C=("MHA D128 full fp16 B2 H16 N8192" "MHA D64 full fp16 B2 H16 N8192")
one() {
  (cd $2 && PYTHONPATH=$2 timeout 100 python -m bench.cells --modes fwd --cells "${C[@]}" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1)
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6
}
one base1 $R/DRAFT/base
one split1 $R
one split2 $R
one base2 $R/DRAFT/base
