# (issue 48) head_dim-128 sliding windows on the Hopper forward with 64-key blocks in 3 or 4 slots (win128.diff:
# DIYFLASH_PROBE_WIN128=3|4) against its 128-key blocks in 2 (head), beside FlexAttention: five causal windows
# at N16384 in processes head, s3, s4, s4, s3, head, then tests/test_hopper.py on s3 and s4 (a line each to
# $OUT/ab.txt as it goes). From the repository root, OUT set:
#   bash bench/probes/drafts/fwd_d128_window_blocks/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_d128_window_blocks
git apply $D/win128.diff 2>/dev/null || echo "patch already applied"
for v in head s3 s4 s4 s3 head; do
  DIYFLASH_PROBE_WIN128=$([ $v = head ] || echo ${v#s}) TRITON_CACHE_DIR=/tmp/tc_$v timeout 100 python3 $D/cells.py --modes fwd \
    --run "d128 window blocks: $v" --out $OUT/win.jsonl > $OUT/win_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/win_$v.log | sort -u | cut -d'|' -f2,3,5,6 | sed "s/^/$v /" >> $OUT/ab.txt
done
for v in s3 s4; do
  DIYFLASH_PROBE_WIN128=${v#s} DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_$v timeout 150 python3 -m pytest -q -n 12 \
    -p no:cacheprovider tests/test_hopper.py -m "not slow" > $OUT/tests_$v.log 2>&1; echo "tests $v rc=$?" >> $OUT/ab.txt
  tail -3 $OUT/tests_$v.log >> $OUT/ab.txt
done
cat $OUT/ab.txt
