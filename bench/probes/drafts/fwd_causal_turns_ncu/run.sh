#!/bin/bash
# (issue 48) Why the Hopper forward's consumers in turns lose on causal head_dim-64 tiles (0.97-0.99x in every form
# tried) where they win without masks (1.03-1.06x): Nsight Compute on one launch of MHA D64 causal fp16 B2 H16 N8192,
# the kernel as it runs (no turns on causal calls) and with turns forced (hopper.Tiles.meta's TURNS), and the full
# cell (turns, the kernel's) beside them; stall samples by SASS opcode and the largest sites.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_causal_turns_ncu
for v in causal causal_turns full; do
  causal=--causal; [ $v = full ] && causal=
  timeout 170 ncu --profile-from-start off --clock-control none -k regex:hopper_fwd --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis -o $OUT/$v -f \
    python $D/one.py $v --shape 2x16x64 --n 8192 $causal --run diyflash > $OUT/ncu_$v.log 2>&1
  echo "== $v rc=$?"; tail -3 $OUT/ncu_$v.log
  ncu -i $OUT/$v.ncu-rep --page details --csv > $OUT/details_$v.csv 2>/dev/null
  ncu -i $OUT/$v.ncu-rep --page source --csv --print-source sass > $OUT/source_$v.csv 2>/dev/null
  python $D/summarize.py $OUT/details_$v.csv $OUT/source_$v.csv > $OUT/summary_$v.txt 2>&1
  cat $OUT/summary_$v.txt | head -60
done
