# (issue 48) The shifted stats A/B, processes in turns on one machine: shift, head, head, shift.
# BASE: a directory holding the tree before's diyflash package (git archive 695b973 diyflash csrc_registry | tar -x -C BASE).
# bash bench/probes/drafts/bwd_stats_shifted/ab.sh BASE OUT_DIR
base=${1:?BASE} out=${2:?OUT_DIR}
i=0
for v in shift head head shift; do
    i=$((i + 1))
    path=$PWD:$PYTHONPATH
    [ "$v" = head ] && path=$base:$path
    PYTHONPATH=$path timeout 80 python bench/probes/drafts/bwd_stats_shifted/ab.py "$v" "variant-$i" "$out/ab.jsonl" \
        > "$out/ab_$i.log" 2>&1
    echo "process $i ($v) rc=$?"; grep -E "TFLOPS|Error" "$out/ab_$i.log"
done
