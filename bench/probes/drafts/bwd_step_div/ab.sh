# (issue 48) The backward step index A/B, processes in turns on one machine: fdiv, div, div, fdiv.
# bash bench/probes/drafts/bwd_step_div/ab.sh OUT_DIR
out=${1:?OUT_DIR}
i=0
for v in fdiv div div fdiv; do
    i=$((i + 1))
    timeout 40 python bench/probes/drafts/bwd_step_div/ab.py "$v" "variant-$i" "$out/ab.jsonl" > "$out/ab_$i.log" 2>&1
    echo "process $i ($v) rc=$?"; grep -E "TFLOPS" "$out/ab_$i.log"
done
