# (issue 48) head_dim-64 sliding windows on the Hopper forward with 64-key blocks in 6 slots (win64.diff:
# DIYFLASH_PROBE_WIN_BN=64) against its 128-key blocks in 3 (head), both forced (DIYFLASH_ATTENTION_BACKEND=hopper),
# beside FlexAttention: four causal windows at N16384 in processes bn64, head, head, bn64, then tests/test_hopper.py
# on bn64 (a line each to $OUT/ab.txt as it goes). From the repository root, OUT set:
#   bash bench/probes/drafts/fwd_d64_window_blocks/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DIYFLASH_ATTENTION_BACKEND=hopper; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_d64_window_blocks
git apply $D/win64.diff 2>/dev/null || echo "patch already applied"
for v in bn64 head head bn64; do
  DIYFLASH_PROBE_WIN_BN=$([ $v = bn64 ] && echo 64) TRITON_CACHE_DIR=/tmp/tc_$v timeout 100 python3 $D/cells.py --modes fwd \
    --run "d64 window blocks: $v" --out $OUT/win.jsonl > $OUT/win_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/win_$v.log | sort -u | cut -d'|' -f2,4,5,6 | sed "s/^/$v /" >> $OUT/ab.txt
done
env -u DIYFLASH_ATTENTION_BACKEND DIYFLASH_PROBE_WIN_BN=64 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_bn64 timeout 170 python3 -m pytest -q -n 12 \
  -p no:cacheprovider tests/test_hopper.py -m "not slow" > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/ab.txt
tail -3 $OUT/tests.log >> $OUT/ab.txt
cat $OUT/ab.txt
