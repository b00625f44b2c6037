# (issue 48) the Hopper backward with dq's share over a warpgroup's own keys issued before the wait for the other
# warpgroup's half of ds (dq_split.diff: DIYFLASH_PROBE_BWD_DQ_SPLIT=1 sets hopper.BWD_DQ_SPLIT, the kernel's
# DQ_SPLIT) against the kernel (head: dq over all 128 keys once both halves are in), beside cuDNN on six of
# bench.cells' cells, processes head, split, split, head; then the GPU fast tier on split. From the repository
# root, OUT set:
#   bash bench/probes/drafts/bwd_dq_split/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_dq_split
git apply $D/dq_split.diff 2>/dev/null || patch -p1 < $D/dq_split.diff || echo "patch not applied"
CELLS=("GQA32/8 D128 causal bf16 B4 N4096" "GQA32/8 D128 causal bf16 B1 N16384" "MHA D64 full fp16 B2 H16 N8192"
       "MHA D64 causal fp16 B2 H16 N8192" "MHA D128 full fp16 B2 H16 N8192" "MHA D128 causal fp16 B2 H16 N8192")
for v in head split split head; do
  DIYFLASH_PROBE_BWD_DQ_SPLIT=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 90 python3 -m bench.cells \
    --modes bwd --cells "${CELLS[@]}" --run "bwd dq split: $v" --out $OUT/ab_$v$RANDOM.jsonl > $OUT/ab_$v.log 2>&1
  echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
DIYFLASH_PROBE_BWD_DQ_SPLIT=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_split timeout 330 python3 -m pytest -q -n 16 \
  -p no:cacheprovider -m "not slow" tests/ --ignore=tests/test_registry.py --ignore=tests/test_utils.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
git apply -R $D/dq_split.diff 2>/dev/null || patch -R -p1 < $D/dq_split.diff
cat $OUT/ab.txt
