# (issue 48) the Hopper backward at head_dim 64 without masks on 128 query rows a step (hopper.BWD_WIDE_TILES)
# against 64 (hopper.bwd_wide patched to False): the Hopper GPU tests first, then processes narrow, wide, wide,
# narrow beside cuDNN on three D64 cells without masks and MHA D64 causal (the same kernel in both: a control).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider \
  tests/test_hopper_backward.py tests/test_hopper.py tests/test_attention_varlen.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
CELLS=("MHA D64 full fp16 B2 H16 N8192" "MHA D64 full bf16 B4 H32 N4096" "GQA32/8 D64 full bf16 B1 N16384"
       "MHA D64 causal fp16 B2 H16 N8192")
for v in narrow wide wide narrow; do
  TRITON_CACHE_DIR=/tmp/tc timeout 150 python3 -c "
import sys
from diyflash.kernels.attention import hopper
if '$v' == 'narrow':
    hopper.bwd_wide = lambda *a, **k: False
from bench import cells
cells.CELLS.update({'MHA D64 full bf16 B4 H32 N4096': (4, 32, 32, 4096, 64, False, 'bf16', None),
                    'GQA32/8 D64 full bf16 B1 N16384': (1, 32, 8, 16384, 64, False, 'bf16', None)})
sys.exit(cells.main(sys.argv[1:]))" --modes bwd --cells "${CELLS[@]}" --run "bwd m128: $v" --out $OUT/ab_$v.jsonl \
    > $OUT/ab_$v$RANDOM.log 2>&1
  echo "$v rc=$?" >> $OUT/ab.txt
done
cat $OUT/ab.txt
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
rows = [json.loads(l) for v in ("narrow", "wide") for l in open(f"{out}/ab_{v}.jsonl")]
for c in dict.fromkeys(r["cell"] for r in rows):
    cu = statistics.median(r["tflops"] for r in rows if r["cell"] == c and r["provider"] == "cudnn")
    line = [c[:34], f"cudnn {cu:.0f}"]
    for v in ("narrow", "wide"):
        ts = sorted(r["tflops"] for r in rows if r["cell"] == c and r["provider"] == "diyflash" and r["run"].endswith(v))
        line.append(f"{v} {statistics.median(ts):.1f} [{ts[0]:.1f}-{ts[-1]:.1f}] {statistics.median(ts) / cu:.3f}x")
    print(" | ".join(line))
PY
