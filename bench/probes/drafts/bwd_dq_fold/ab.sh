# (issue 48) the Hopper backward with dq's power-of-two unprescale in the convert pass (c08e31c: no multiply
# between dq's wait and its store) against the kernel before it (BASE: 2ccd4aa's diyflash/, made by
#   mkdir -p .probe2/base && git archive 2ccd4aa diyflash | tar -x -C .probe2/base
# and carried to the device), beside cuDNN and FlexAttention on bench.cells' eight cells, processes base, fold,
# fold, base; first tests/test_hopper_backward.py on the fold; last ncu on the D64 backward (MHA fp16 full),
# whose step has not been profiled: stall samples by opcode and the pipes' use. From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_dq_fold/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
BASE=${BASE:-.probe2/base}
DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_fold timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider \
  tests/test_hopper_backward.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
for v in base fold fold base; do
  P=$PWD; [ $v = base ] && P=$BASE:$PWD
  PYTHONPATH=$P TRITON_CACHE_DIR=/tmp/tc_$v timeout 90 python3 -m bench.cells --modes bwd \
    --run "bwd dq fold: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
NCU="ncu --profile-from-start off --clock-control none -k regex:hopper_bwd --section SpeedOfLight --section WarpStateStats
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters"
TRITON_CACHE_DIR=/tmp/tc_fold timeout 150 $NCU -o $OUT/d64 python3 -m bench.ncu --shape 2x16x64 --n 8192 --mode bwd \
  > $OUT/ncu.log 2>&1; echo "ncu rc=$?" >> $OUT/ab.txt
ncu -i $OUT/d64.ncu-rep --page details > $OUT/d64_details.txt 2>&1
ncu -i $OUT/d64.ncu-rep --page source --csv --print-source sass > $OUT/d64_sass.csv 2>&1
grep -E "Duration|SM Frequency|Throughput|Issue Slots|Pipe|Eligible|Active Warps" $OUT/d64_details.txt | head -30 >> $OUT/ab.txt
cat $OUT/ab.txt
