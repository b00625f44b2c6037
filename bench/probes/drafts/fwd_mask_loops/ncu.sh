#!/bin/bash
# (issue 48) Why the three-loop form (loops.patch) ran slower than the one loop it replaces on every causal cell (MHA
# D64 causal 0.991x cuDNN against 1.027x) though its hot loop has half the instructions: Nsight Compute on one launch
# of MHA D64 causal fp16 B2 H16 N8192 each, the kernel (base) and the probe module (loops); stall samples by SASS
# opcode and the largest sites (summarize.py: git show d6ac841:bench/probes/drafts/fwd_causal_turns_ncu/).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_mask_loops
M=$(mktemp -d)/probe_forward_sm90.py
python $D/apply.py $M || exit 1
for v in base loops; do
  timeout 150 ncu --profile-from-start off --clock-control none -k regex:hopper_fwd --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section InstructionStats -o $OUT/$v -f \
    python $D/one.py $v $M --shape 2x16x64 --n 8192 --causal --run diyflash > $OUT/ncu_$v.log 2>&1
  echo "== ncu $v rc=$?"; tail -2 $OUT/ncu_$v.log
  ncu -i $OUT/$v.ncu-rep --page details --csv > $OUT/details_$v.csv 2>/dev/null
  ncu -i $OUT/$v.ncu-rep --page source --csv --print-source sass > $OUT/source_$v.csv 2>/dev/null
  python $D/summarize.py $OUT/details_$v.csv $OUT/source_$v.csv > $OUT/summary_$v.txt 2>&1
  grep -E "Duration|Issue Slots|Cycles Per|No Instruction|total samples|^  [A-Z]" $OUT/summary_$v.txt | head -24
  rm -f $OUT/$v.ncu-rep $OUT/details_$v.csv $OUT/source_$v.csv
done
