# (issue 48) the Hopper forward at head_dim 64 with 4 key/value slots (stages.diff: DIYFLASH_PROBE_D64_STAGES=4)
# against 3 (the kernel), after ncu had the D64 causal launch's tensor pipe at 47.8 % (D128 full: 79.0 %). Outputs
# cannot change (slots only change when a block lands). Four D64 cells in processes in turns, a line each to
# $OUT/ab.txt as it goes. From the repository root, OUT set:   bash bench/probes/drafts/fwd_d64_stages/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_d64_stages
git apply $D/stages.diff 2>/dev/null || echo "patch already applied"
for v in 4 3 3 4 4 3; do
  DIYFLASH_PROBE_D64_STAGES=$v TRITON_CACHE_DIR=/tmp/tc_$v timeout 100 python3 $D/cells.py --modes fwd \
    --run "d64 slots: $v" --out $OUT/slots.jsonl > $OUT/slots_$v.log 2>&1; echo "s$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/slots_$v.log | sort -u | cut -d'|' -f2,4,5,6 | sed "s/^/s$v /" >> $OUT/ab.txt
done
cat $OUT/ab.txt
