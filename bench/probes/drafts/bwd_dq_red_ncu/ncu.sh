#!/bin/bash
# (issue 48) Why dq added from the MMA warpgroups' registers (probe bwd_dq_red, the kernel of f97fec5) ran 0.84-0.88x
# the kernel: Nsight Compute on one backward launch of MHA fp16 B2 H16 N8192 D128 each, the kernel (base: this
# tree) and the draft (RED: git archive f97fec5 diyflash csrc_registry); stall samples by SASS opcode and site.
# usage: RED=DIR bash bench/probes/drafts/bwd_dq_red_ncu/ncu.sh
export PYTHONUNBUFFERED=1
D=bench/probes/drafts/bwd_dq_red_ncu
for v in base red; do
  if [ $v = base ]; then T=$PWD; else T=${RED:?a checkout of f97fec5}; fi
  PYTHONPATH=$T timeout 200 ncu --profile-from-start off --clock-control none -k regex:hopper_bwd --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis -o $OUT/$v -f \
    python $D/one.py $T > $OUT/ncu_$v.log 2>&1
  echo "== ncu $v rc=$?"; tail -2 $OUT/ncu_$v.log
  ncu -i $OUT/$v.ncu-rep --page details --csv > $OUT/details_$v.csv 2>/dev/null
  ncu -i $OUT/$v.ncu-rep --page source --csv --print-source sass > $OUT/source_$v.csv 2>/dev/null
  python $D/summarize.py $OUT/details_$v.csv $OUT/source_$v.csv > $OUT/summary_$v.txt 2>&1
  grep -E "Duration|SM Frequency|Throughput|Issue Slots|Eligible|total samples|^  [A-Z]" $OUT/summary_$v.txt | head -30
  rm -f $OUT/$v.ncu-rep $OUT/details_$v.csv $OUT/source_$v.csv
done
