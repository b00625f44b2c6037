# (issue 48) The softcap fold A/B, processes in turns on one machine: new, unfolded, unfolded, new.
# bash bench/probes/drafts/fwd_softcap_fold/ab.sh OUT_DIR
out=${1:?OUT_DIR}
i=0
for v in new unfolded unfolded new; do
    i=$((i + 1))
    CELLS=0,1,2 MODES=fwd,bwd timeout 150 python bench/probes/drafts/fwd_softcap_fold/ab.py "$v" "variant-$i" \
        "$out/ab.jsonl" > "$out/ab_$i.log" 2>&1
    echo "process $i ($v) rc=$?"; grep -E "TFLOPS" "$out/ab_$i.log"
done
