# (issue 48) the Hopper backward with each step's whole dq tile (64 x D) computed by one MMA warpgroup, the two
# in turns (whole.diff: DIYFLASH_PROBE_DQ_WHOLE=1; dq = ds k with N = D: 96 B of shared-memory operand reads a
# cycle instead of the halves' 128 (D128) and 192 (D64); the other warpgroup does not wait for ds; offline
# sm_90a: D128 causal 72 B of spills against 8, D64 none) against the kernel's column halves (head), beside cuDNN:
# seven headline cells, processes head, whole, whole, head; then tests/test_hopper_backward.py on whole (a line
# each to $OUT/ab.txt as it goes). From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_dq_whole/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_dq_whole
git apply $D/whole.diff 2>/dev/null || echo "patch already applied"
DIYFLASH_PROBE_DQ_WHOLE=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_whole timeout 140 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py -m "not slow" -x > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/ab.txt
tail -2 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
for v in head whole whole head; do
  DIYFLASH_PROBE_DQ_WHOLE=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 95 python3 $D/cells.py --modes bwd \
    --run "dq whole: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/whole.diff
cat $OUT/ab.txt
