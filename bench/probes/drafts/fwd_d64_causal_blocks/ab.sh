# (issue 48) head_dim-64 calls without a window on the Hopper forward's window tiles (64-key blocks in 6 slots,
# three consumers, no turns; bn64.diff: DIYFLASH_PROBE_D64_BN64=1) against its 128-key blocks in 3 (head), beside
# cuDNN: three causal cells and one full, processes head, bn64, bn64, head; then the GPU fast tier on the tree
# (a line each to $OUT/ab.txt as it goes). From the repository root, OUT set:
#   bash bench/probes/drafts/fwd_d64_causal_blocks/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_d64_causal_blocks
git apply $D/bn64.diff 2>/dev/null || echo "patch already applied"
for v in head bn64 bn64 head; do
  DIYFLASH_PROBE_D64_BN64=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 75 python3 $D/cells.py --modes fwd \
    --run "d64 causal blocks: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,3,5,6 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/bn64.diff
DIYFLASH_TEST_DEVICE=cuda timeout 430 python3 -m pytest -q -n 16 -p no:cacheprovider -m "not slow" tests/ \
  --ignore=tests/test_registry.py --ignore=tests/test_utils.py > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?" >> $OUT/ab.txt
tail -2 $OUT/gpu_tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | head -10 >> $OUT/ab.txt
cat $OUT/ab.txt
