# (issue 48) The pinned p @ v wait A/B, processes in turns on one machine: pin, base, base, pin.
# bash bench/probes/drafts/fwd_pin_wait/ab.sh OUT_DIR
out=${1:?OUT_DIR}
i=0
for v in pin base base pin; do
    i=$((i + 1))
    timeout 70 python bench/probes/drafts/fwd_pin_wait/ab.py "$v" "variant-$i" "$out/ab.jsonl" > "$out/ab_$i.log" 2>&1
    echo "process $i ($v) rc=$?"; grep -E "TFLOPS" "$out/ab_$i.log"
done
