# (issue 48) the Hopper backward at head_dim 128 with 3 q/dout/stat stages (s3.diff: DIYFLASH_PROBE_BWD_S3=1;
# offline sm_90a: 231.5 KB of shared memory, 152-184 B of spills against 4-8) against its 2 (head), beside cuDNN:
# four D128 headline cells, processes head, s3, s3, head; then tests/test_hopper_backward.py on s3 (a line each to
# $OUT/ab.txt as it goes). From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_d128_stages/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_d128_stages
git apply $D/s3.diff 2>/dev/null || echo "patch already applied"
for v in head s3 s3 head; do
  DIYFLASH_PROBE_BWD_S3=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 110 python3 $D/cells.py --modes bwd \
    --run "d128 bwd stages: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
DIYFLASH_PROBE_BWD_S3=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_s3 timeout 120 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py -m "not slow" > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/ab.txt
tail -2 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
git apply -R $D/s3.diff
cat $OUT/ab.txt
