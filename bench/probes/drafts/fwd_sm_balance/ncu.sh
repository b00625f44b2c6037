#!/bin/bash
# SM activity balance of one Hopper forward launch per cell (ncu), then per-SM spread
# From the repository root with PYTHONPATH=$PWD (the run: the H200 machine's ncu, torch 2.11, Triton 3.6)
M=sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__cycles_elapsed.max,sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active
for c in mha_d64_causal mha_d64_full mha_d128_causal mha_d128_full gqa_b1_n16384 gqa_b4_n4096; do
  ncu --profile-from-start off --clock-control none -k regex:hopper_fwd --metrics $M --csv python bench/probes/drafts/fwd_sm_balance/one_launch.py $c > $OUT/ncu_$c.csv 2> $OUT/ncu_$c.err
  echo "== $c"; grep -E 'sm__cycles|gpu__time' $OUT/ncu_$c.csv | awk -F'","' '{print $(NF-2), $(NF-1), $NF}' | tr -d '"'
done
