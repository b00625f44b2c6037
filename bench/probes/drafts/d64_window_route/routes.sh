# (issue 48) which forward kernel a head_dim-64 call with a sliding window should take under "auto": each cell
# forced to the Hopper kernel and to the portable one (DIYFLASH_ATTENTION_BACKEND) beside FlexAttention, processes
# in turns (first run: auto, hopper, portable, auto on cells_a.py; second: hopper, portable on cells_b.py).
# From the repository root, OUT set:   bash bench/probes/drafts/d64_window_route/routes.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/d64_window_route
for run in "a:auto hopper portable auto" "b:hopper portable"; do
  for b in ${run#*:}; do
    DIYFLASH_ATTENTION_BACKEND=$b timeout 130 python3 $D/cells_${run%%:*}.py --modes fwd --run "d64 routes ${run%%:*}: $b" --out $OUT/route.jsonl > $OUT/route_$b.log 2>&1
    grep "^| [wGM]" $OUT/route_$b.log | sort -u | cut -d'|' -f2,4,5,6 | sed "s/^/$b /"
  done
done
