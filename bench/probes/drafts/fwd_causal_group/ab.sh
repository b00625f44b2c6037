#!/bin/bash
# (issue 48) The causal Hopper forward's head group (hopper.schedule: the fewest heads that divide the batch's
# and hold two tiles a program) against larger groups. semantics._turn deals a group's tiles back and forth; with
# MHA D64 causal B2 H16 N8192 (43 tiles of 192 rows a head, 8 heads a group: 344 tiles over 132 programs) the
# group's second pair of turns is part full, and a count of key blocks a tile (+1 a tile) has the average program
# at 0.975x the busiest one's work (ncu's SM balance bounded the gain at 2.8 %: results/fwd_sm_balance_h200.txt),
# 0.991x with 16 or 32 heads a group; D128 causal (64 tiles of 128 rows) 0.9995x at every group, here the
# control: what a larger group costs in L2. Processes g0 (the rule), g16, g32, g0, g16, g32; forward only.
# Second run (HEADS="4 2"): smaller groups than the rule's on the causal D128 cells and D64 causal, where the
# count has 2 or 4 heads a group (D128) as balanced as 8 across the launch's groups dealt in alternate directions.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
read -ra G <<< "${HEADS:-16 32}"
if [ -n "${CELLS:-}" ]; then IFS=";" read -ra C <<< "$CELLS"; else
C=("MHA D64 causal fp16 B2 H16 N8192" "MHA D128 causal fp16 B2 H16 N8192"); fi
one() {
  timeout 100 python -c "
import sys, runpy
import diyflash.kernels.attention.hopper as h
g, real = int(sys.argv[1]), h.schedule
def forced(num_tiles, num_bh, causal, device):
    programs, group = real(num_tiles, num_bh, causal, device)
    return programs, (g if g and causal and num_bh % g == 0 else group)
h.schedule = forced
sys.argv = ['bench.cells'] + sys.argv[2:]
runpy.run_module('bench.cells', run_name='__main__')" $2 --modes fwd --cells "${C[@]}" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
for r in 1 2; do
  one g0-$r 0
  for g in "${G[@]}"; do one g$g-$r $g; done
done
