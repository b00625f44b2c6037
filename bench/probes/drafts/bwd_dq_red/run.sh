S=$(date +%s)
export PYTHONPATH=$PWD:$PWD/.devsite
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
DIYFLASH_TEST_DEVICE=cuda timeout 240 python -m pytest -q -x -n 4 -p no:cacheprovider tests/test_hopper_backward.py 2>&1 | tail -5
echo "tests done at $(( $(date +%s) - S )) s"
for lab in base new new base; do
  if [ $lab = base ]; then T=${BASE:?a checkout of the tree before: git archive HEAD~ diyflash csrc_registry}; else T=$PWD; fi
  PYTHONPATH=$T:$PWD/.devsite timeout 120 python bench/probes/drafts/bwd_dq_red/ab.py $T $lab $OUT/ab.jsonl 2>&1 | grep -v Warning | tail -8
  echo "$lab done at $(( $(date +%s) - S )) s"
done
python - <<'PY'
import json, os, statistics as st
rows=[json.loads(l) for l in open(os.environ["OUT"]+"/ab.jsonl")]
for c in dict.fromkeys(r["cell"] for r in rows):
    b=[r for r in rows if r["cell"]==c and r["label"]=="base"]; n=[r for r in rows if r["cell"]==c and r["label"]=="new"]
    if not b or not n: continue
    print(f"| {c} | base {', '.join(f'{r['ratio']:.3f}' for r in b)} | new {', '.join(f'{r['ratio']:.3f}' for r in n)} | new/base TFLOPS {st.median(r['tflops'] for r in n)/st.median(r['tflops'] for r in b):.3f} |")
PY
