# (issue 48) the Hopper backward with s^T's and dp^T's accumulators starting at -lse2 / qk_rest and -delta
# (stats_acc.diff: DIYFLASH_PROBE_BWD_STATS_ACC=1), so that p and ds take no stat after the matmuls' waits (ncu's
# stall samples sat 13 % at the first uses of lse and delta, loaded after those waits; loading them before the waits
# spilled), against the kernel (head), beside cuDNN and FlexAttention on bench.cells' eight cells, processes
# head, acc, acc, head; first tests/test_hopper_backward.py on acc (a line each to $OUT/ab.txt as it goes).
# From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_stats_acc/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_stats_acc
git apply $D/stats_acc.diff 2>/dev/null || echo "patch already applied"
DIYFLASH_PROBE_BWD_STATS_ACC=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_acc timeout 150 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py -m "not slow" -x > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/ab.txt
tail -2 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
for v in head acc acc head; do
  DIYFLASH_PROBE_BWD_STATS_ACC=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 110 python3 -m bench.cells --modes bwd \
    --run "bwd stats in acc: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/stats_acc.diff
cat $OUT/ab.txt
