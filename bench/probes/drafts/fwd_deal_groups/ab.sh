# (issue 48) the Hopper forward's causal head groups holding 3 tiles a program (deal.diff: DIYFLASH_PROBE_DEAL=3)
# against 2 (the kernel): model.py's per-program work puts the D64 causal cells at 1.019-1.027x the mean under 2,
# 1.006-1.016x under 3 (the D128 cells' groups do not change). Outputs cannot change (a row's blocks and order
# are its own): not checked. Four causal D64 cells in processes in turns; a line each to $OUT/ab.txt as it goes.
# From the repository root, OUT set:   bash bench/probes/drafts/fwd_deal_groups/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_deal_groups
git apply $D/deal.diff 2>/dev/null || echo "patch already applied"
for v in 3 2 2 3 3 2; do
  DIYFLASH_PROBE_DEAL=$v TRITON_CACHE_DIR=/tmp/tc timeout 100 python3 $D/cells.py --modes fwd \
    --run "deal groups: x$v" --out $OUT/deal.jsonl > $OUT/deal_$v.log 2>&1; echo "x$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/deal_$v.log | sort -u | cut -d'|' -f2,4,5,6 | sed "s/^/x$v /" >> $OUT/ab.txt
done
cat $OUT/ab.txt
