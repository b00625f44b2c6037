export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
F=diyflash/kernels/attention/backward_sm90.py
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
ab() {  # $1 = variant label
  cp .probe2/backward_sm90_$1.py $F
  timeout 70 python3 -m bench.attention --shapes 1x64x128 2x64x128 1x32x128 --kv-heads 8 --n 16384 --dtypes bf16 --causal true --modes bwd --providers diyflash sdpa-cudnn --out $OUT/ab_$1_$2_gqa.jsonl > $OUT/ab_$1_$2_gqa.txt 2>&1 || echo "rc $1 gqa $?"
  timeout 45 python3 -m bench.attention --shapes 4x32x128 --kv-heads 8 --n 4096 --dtypes bf16 --causal true --modes bwd --providers diyflash sdpa-cudnn --out $OUT/ab_$1_$2_gqa4.jsonl > $OUT/ab_$1_$2_gqa4.txt 2>&1 || echo "rc $1 gqa4 $?"
  timeout 50 python3 -m bench.attention --shapes 2x16x128 --n 8192 --dtypes fp16 --causal true --modes bwd --providers diyflash sdpa-cudnn --out $OUT/ab_$1_$2_mha.jsonl > $OUT/ab_$1_$2_mha.txt 2>&1 || echo "rc $1 mha $?"
}
ab new 1; ab old 1; ab new 2; ab old 2
cp .probe2/backward_sm90_new.py $F
python3 - <<'PY'
import json, glob, os, collections
out = os.environ["OUT"]; t = collections.defaultdict(dict)
for f in sorted(glob.glob(out + "/ab_*.jsonl")):
    var, rep = os.path.basename(f).split("_")[1:3]
    rows = [json.loads(l) for l in open(f)]
    for r in rows:
        if r["provider"] != "diyflash": continue
        c = [x for x in rows if x["provider"] == "sdpa-cudnn" and (x["b"], x["h"], x["d"], x["n"]) == (r["b"], r["h"], r["d"], r["n"])][0]
        t[(r["b"], r["h"], r.get("hkv"), r["d"], r["n"])][var + rep] = (r["tflops"], r["tflops"] / c["tflops"])
for k, v in t.items():
    print(k, " ".join(f"{n}:{a:.0f}({b:.3f})" for n, (a, b) in sorted(v.items())))
PY
DIYFLASH_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q -n 16 -p no:cacheprovider -m "not slow" tests/test_hopper.py tests/test_hopper_backward.py > $OUT/tests.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/tests.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head
