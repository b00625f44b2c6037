# (issue 48) The backward step index A/B, processes in turns on one machine: count, div, div, count.
# bash bench/probes/drafts/bwd_step_count/ab.sh OUT_DIR
out=${1:?OUT_DIR}
i=0
for v in count div div count; do
    i=$((i + 1))
    timeout 80 python bench/probes/drafts/bwd_step_count/ab.py "$v" "variant-$i" "$out/ab.jsonl" > "$out/ab_$i.log" 2>&1
    echo "process $i ($v) rc=$?"; grep -E "TFLOPS|Error" "$out/ab_$i.log"
done
