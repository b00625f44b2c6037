#!/bin/bash
# (issue 48) SM activity balance of one split Hopper forward call per non-causal headline cell (ncu: its kernel and
# the merge launch), as results/fwd_sm_balance_h200.txt measured the whole tiles' (avg / max of sm__cycles_active).
# From the repository root with PYTHONPATH=$PWD (the H200 machine's ncu, torch 2.11, Triton 3.6).
M=sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__cycles_elapsed.max,gpu__time_duration.sum
for c in mha_d64_full mha_d128_full; do
  timeout 120 ncu --profile-from-start off --clock-control none -k regex:"hopper_fwd|merge_pieces" --metrics $M --csv \
    python bench/probes/drafts/fwd_split_round/one_launch.py $c > $OUT/ncu_$c.csv 2> $OUT/ncu_$c.err
  echo "== $c"; grep -E 'sm__cycles|gpu__time' $OUT/ncu_$c.csv | awk -F'","' '{print $5, $(NF-2), $(NF-1), $NF}' | tr -d '"'
done
