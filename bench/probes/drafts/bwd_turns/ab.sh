# (issue 48) the Hopper backward's MMA warpgroups issuing each step's s^T and dp^T in turns (turns.diff:
# DIYFLASH_PROBE_BWD_TURNS=1; the forward's ring of named barriers, warpgroup 0 first), so that one warpgroup's
# scores are done, and its softmax runs, while the other's matmuls are still queued (the two now issue together
# and reach their softmax together), against the kernel (head), beside cuDNN: seven headline cells, processes
# head, turns, turns, head; first tests/test_hopper_backward.py on turns (a line each to $OUT/ab.txt as it goes).
# From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_turns/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_turns
git apply $D/turns.diff 2>/dev/null || echo "patch already applied"
DIYFLASH_PROBE_BWD_TURNS=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_turns timeout 140 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py -m "not slow" -x > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/ab.txt
tail -2 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
for v in head turns turns head; do
  DIYFLASH_PROBE_BWD_TURNS=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 95 python3 $D/cells.py --modes bwd \
    --run "bwd turns: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/turns.diff
cat $OUT/ab.txt
