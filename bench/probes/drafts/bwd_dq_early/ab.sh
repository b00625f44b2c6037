# (issue 48) the Hopper backward at head_dim 64 with dq's own-key share issued right behind dk, before dv and dk are
# waited for (DQ_EARLY; ncu of the D64 backward after the dq split has that wait among a step's largest:
# bench/results/bwd_ncu_stalls_h200.txt). dq_early.diff turns it on by DIYFLASH_PROBE_BWD_DQ_EARLY=1 (D64 only: at
# D128 ptxas serializes every wgmma of that build, C7512). This script: the backward's GPU tests on the form, then
# processes head, early, early, head beside cuDNN on the two MHA D64 cells. From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_dq_early/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_dq_early
git apply $D/dq_early.diff || echo "patch not applied"
DIYFLASH_PROBE_BWD_DQ_EARLY=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc timeout 130 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
CELLS=("MHA D64 full fp16 B2 H16 N8192" "MHA D64 causal fp16 B2 H16 N8192")
for v in head early early head; do
  DIYFLASH_PROBE_BWD_DQ_EARLY=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc timeout 90 python3 -m bench.cells \
    --modes bwd --cells "${CELLS[@]}" --run "bwd dq early: $v" --out $OUT/ab_$v$RANDOM.jsonl > $OUT/ab_$v.log 2>&1
  echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/dq_early.diff
cat $OUT/ab.txt
