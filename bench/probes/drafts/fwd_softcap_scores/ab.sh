#!/bin/bash
# processes new, before, before, new (or RUNS) (ab.py); rows to $OUT/ab.jsonl, a line each to stdout
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
i=0
for v in ${RUNS:-new before before new}; do
  i=$((i+1)); timeout 240 python bench/probes/drafts/fwd_softcap_scores/ab.py $v "$v-$i" $OUT/ab.jsonl 2>&1 | grep -v Warning | tail -4
done
