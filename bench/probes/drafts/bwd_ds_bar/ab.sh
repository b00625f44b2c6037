# (issue 48) the Hopper backward with the MMA warpgroups' ds exchange as one named barrier of their 256 threads
# (ds_bar.diff: DIYFLASH_PROBE_BWD_DS_BAR=1 sets hopper.BWD_DS_BAR, the kernel's DS_BAR) against the kernel
# (head: a warpgroup barrier, an mbarrier arrive and a try-wait loop), beside cuDNN and FlexAttention on
# bench.cells' eight cells, processes head, bar, bar, head; first tests/test_hopper_backward.py and
# tests/test_hopper.py on bar. From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_ds_bar/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_ds_bar
git apply $D/ds_bar.diff 2>/dev/null || patch -p1 < $D/ds_bar.diff || echo "patch not applied"
DIYFLASH_PROBE_BWD_DS_BAR=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_bar timeout 200 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py tests/test_hopper.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
for v in head bar bar head; do
  DIYFLASH_PROBE_BWD_DS_BAR=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 120 python3 -m bench.cells \
    --modes bwd --run "bwd ds bar: $v" --out $OUT/ab_$v$RANDOM.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/ds_bar.diff 2>/dev/null || patch -R -p1 < $D/ds_bar.diff
cat $OUT/ab.txt
