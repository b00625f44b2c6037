# (issue 48) The Hopper backward at head_dim 128 with two dq buffers a warpgroup, so that each step's dq tile is handed
# to the writer after the next step's s^T and dp^T are issued (DQ_LATE), against main (BASE: git archive main diyflash
# csrc_registry): the GPU tests of the Hopper backward (TESTS=0 skips them), then processes base, new, new, base
# beside cuDNN. usage: [TESTS=0] [ROUNDS=7] BASE=DIR bash bench/probes/drafts/bwd_d128_dq_late/run.sh
# (PYTHONPATH: pytest-xdist and expecttest where needed)
S=$(date +%s)
if [ "${TESTS:-1}" != 0 ]; then
  DIYFLASH_TEST_DEVICE=cuda PYTHONPATH=$PWD:$PYTHONPATH timeout 240 python -m pytest -q -x -n 4 -p no:cacheprovider \
    tests/test_hopper_backward.py tests/test_hopper_builds.py > $OUT/tests.txt 2>&1
  echo "tests rc=$? at $(( $(date +%s) - S )) s: $(grep -E '[0-9]+ (passed|failed)' $OUT/tests.txt | tail -1)"
fi
for lab in base new new base; do
  if [ $lab = base ]; then T=${BASE:?a checkout of the tree before}; else T=$PWD; fi
  PYTHONPATH=$T:$PYTHONPATH timeout 150 python bench/probes/drafts/bwd_d128_dq_late/ab.py $T $lab $OUT/ab.jsonl 2>&1 \
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
