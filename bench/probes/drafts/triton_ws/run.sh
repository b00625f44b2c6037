#!/bin/bash
# The device call behind probe.py's rows: every cell's kernels compiled first in parallel processes (no timing),
# then one process times the cells.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
P=bench/probes/drafts/triton_ws/probe.py
mapfile -t FW < <(python -c "import runpy; m = runpy.run_path('$P'); print('\n'.join(m['FWD_CELLS']))")
mapfile -t BW < <(python -c "import runpy; m = runpy.run_path('$P'); print('\n'.join(m['BWD_CELLS']))")
i=0
for c in "${FW[@]}"; do timeout 330 python $P --warm "$c" --modes fwd > $OUT/warm_f$i.txt 2>&1 & i=$((i+1)); done
for c in "${BW[@]}"; do timeout 330 python $P --warm "$c" --modes bwd > $OUT/warm_b$i.txt 2>&1 & i=$((i+1)); done
wait
echo "== warm $(date +%T)"; cat $OUT/warm_*.txt | grep -v "^warm" | tail -20; grep -h "^warm" $OUT/warm_*.txt
timeout 200 python $P --run "${RUN:-gluon or triton ws}" --out $OUT/ws.jsonl > $OUT/ws.txt 2>&1
echo "== timed rc=$? $(date +%T)"; grep "^|\|Error" $OUT/ws.txt
