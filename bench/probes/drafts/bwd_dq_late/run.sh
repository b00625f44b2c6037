# (issue 48) The Hopper backward with each step's dq tile handed to the writer (proxy fence, barrier, arrive) after the
# next step's s^T and dp^T are issued (hopper.BWD_DQ_LATE) against the tree before (BASE: git archive HEAD~ diyflash
# csrc_registry): the GPU tests of the Hopper backward, then processes base, late, late, base beside cuDNN.
# usage: [D64=1] BASE=DIR bash bench/probes/drafts/bwd_dq_late/run.sh  (PYTHONPATH: pytest-xdist and expecttest where needed)
S=$(date +%s)
DIYFLASH_TEST_DEVICE=cuda PYTHONPATH=$PWD:$PYTHONPATH timeout 240 python -m pytest -q -x -n 4 -p no:cacheprovider \
  tests/test_hopper_backward.py > $OUT/tests.txt 2>&1
echo "tests rc=$? at $(( $(date +%s) - S )) s: $(tail -1 $OUT/tests.txt)"
for lab in base new new base; do
  if [ $lab = base ]; then T=${BASE:?a checkout of the tree before}; else T=$PWD; fi
  PYTHONPATH=$T:$PYTHONPATH timeout 150 python bench/probes/drafts/bwd_dq_late/ab.py $T $lab $OUT/ab.jsonl 2>&1 \
    | grep -v Warning | tail -8
  echo "$lab done at $(( $(date +%s) - S )) s"
done
python - <<'PY'
import json, os, statistics as st
rows=[json.loads(l) for l in open(os.environ["OUT"]+"/ab.jsonl")]
for c in dict.fromkeys(r["cell"] for r in rows):
    b=[r for r in rows if r["cell"]==c and r["label"]=="base"]; n=[r for r in rows if r["cell"]==c and r["label"]=="new"]
    if not b or not n: continue
    print(f"| {c} | base {', '.join(f'{r['ratio']:.3f}' for r in b)} | late {', '.join(f'{r['ratio']:.3f}' for r in n)} | late/base TFLOPS {st.median(r['tflops'] for r in n)/st.median(r['tflops'] for r in b):.3f} |")
PY
