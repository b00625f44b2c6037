# (issue 48) on the device: the forward's launches (head and m256), then bench.cells' forward in processes
# head, skip, m128, m256, m256, m128, skip, head; rows of every process in $OUT/ab.jsonl (label: "marked pass VARIANT")
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_marked_pass
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
python $D/launches.py head > $OUT/launches_head.txt 2>&1; tail -40 $OUT/launches_head.txt
python $D/launches.py m256 > $OUT/launches_m256.txt 2>&1; grep "##\|_kernel\|regs" $OUT/launches_m256.txt
i=0
for v in head skip m128 m256 m256 m128 skip head; do
  i=$((i+1))
  python $D/ab.py $v --modes fwd --run "marked pass $v" --out $OUT/ab_$i.jsonl > $OUT/ab_$i.log 2>&1 || tail -20 $OUT/ab_$i.log
done
cat $OUT/ab_*.jsonl > $OUT/ab.jsonl; rm -f $OUT/ab_*.jsonl; cat $OUT/ab_*.log > $OUT/ab.log; rm -f $OUT/ab_*.log
python - <<'PY'
import json, os, statistics
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ab.jsonl")]
cells = sorted({r["cell"] for r in rows}, key=lambda c: [r["cell"] for r in rows].index(c))
for c in cells:
    out = []
    for v in ["head", "skip", "m128", "m256"]:
        x = [r["vs_peer"] for r in rows if r["cell"] == c and r["provider"] == "diyflash" and r["run"] == "marked pass " + v]
        t = [r["tflops"] for r in rows if r["cell"] == c and r["provider"] == "diyflash" and r["run"] == "marked pass " + v]
        out.append(f"{v} {statistics.mean(t):.0f} {statistics.mean(x):.3f}x ({','.join(f'{y:.3f}' for y in x)})")
    print(c[:38].ljust(38), " | ".join(out))
PY
