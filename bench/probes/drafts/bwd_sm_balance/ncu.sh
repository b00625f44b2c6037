#!/bin/bash
# SM activity balance of one Hopper backward launch per cell (ncu). From the repository root, PYTHONPATH=$PWD.
M=sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__cycles_elapsed.max,gpu__time_duration.sum,launch__grid_size
for c in gqa_b4_n4096 gqa_b1_n16384 gqa64_b1_n16384 mha_d64_full mha_d64_causal mha_d128_full mha_d128_causal; do
  ncu --profile-from-start off --clock-control none -k regex:hopper_bwd --metrics $M --csv python bench/probes/drafts/bwd_sm_balance/one_launch.py $c > /tmp/bncu_$c.csv 2> /tmp/bncu_$c.err
  echo "== $c"; grep -E 'sm__cycles|gpu__time|grid_size' /tmp/bncu_$c.csv | awk -F'","' '{print $(NF-2), $(NF-1), $NF}' | tr -d '"'
done
cd /tmp && tar czf $OUT/bncu.tgz bncu_*
