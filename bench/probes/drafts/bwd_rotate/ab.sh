# (issue 48) the Hopper backward without causal or window masks with each program's walk over the query row blocks
# rotated to start at row block pid_n (rotate.diff: DIYFLASH_PROBE_BWD_ROTATE=1), so that a head's programs,
# which now all start at row 0 and walk in step, add their dq tiles into different rows at any moment (their TMA
# reduces met on the same lines; the causal cells, whose programs start at their diagonal, run 1.07-1.11x cuDNN
# against the full ones' 1.04-1.06x), against the kernel (head), beside cuDNN: the non-causal cells, processes
# head, rot, rot, head; first tests/test_hopper_backward.py on rot, then the GPU precompile tests (a line each to
# $OUT/ab.txt as it goes). From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_rotate/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_rotate
git apply $D/rotate.diff 2>/dev/null || echo "patch already applied"
DIYFLASH_PROBE_BWD_ROTATE=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_rot timeout 140 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py -m "not slow" -x > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/ab.txt
tail -2 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
for v in head rot rot head; do
  DIYFLASH_PROBE_BWD_ROTATE=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 75 python3 $D/cells.py --modes bwd \
    --run "bwd rotate: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/rotate.diff
DIYFLASH_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_precompile.py > $OUT/precompile.log 2>&1
echo "precompile tests rc=$?" >> $OUT/ab.txt; tail -2 $OUT/precompile.log >> $OUT/ab.txt
cat $OUT/ab.txt
