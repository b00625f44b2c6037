# (issue 48) on the device, after the marked pass's chunks (launch.MARKED_PASS_ROWS): the forward's GPU tests,
# bench.cells' forward in processes base, new, new, base (base = de1effe's tree in base/, new = the working tree;
# $OUT/ab2.jsonl), the launches of new, the first call's compile time (fresh Triton caches), then the rest of the
# GPU fast tier in the time left (one call's limit).
export PYTHONUNBUFFERED=1 DIYFLASH_TEST_DEVICE=cuda; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_marked_pass
export PYTHONPATH=$PWD
timeout 210 python -m pytest -q -p no:cacheprovider tests/test_hopper.py tests/test_attention_varlen.py \
  tests/test_attention_numerics.py > $OUT/tests_a.txt 2>&1; tail -3 $OUT/tests_a.txt; echo "tests a done at $SECONDS s"
i=0
for v in base new new base; do
  i=$((i+1)); p=$PWD; [ $v = base ] && p=$PWD/$D/base:$PWD
  PYTHONPATH=$p python $D/ab.py head --modes fwd --run "marked pass chunks $v" --out $OUT/ab_$i.jsonl > $OUT/ab_$i.log 2>&1 || tail -5 $OUT/ab_$i.log
done
cat $OUT/ab_*.jsonl > $OUT/ab2.jsonl; rm -f $OUT/ab_*.jsonl; cat $OUT/ab_*.log > $OUT/ab2.log; rm -f $OUT/ab_*.log
python - <<'PY'
import json, os, statistics
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ab2.jsonl")]
for c in dict.fromkeys(r["cell"] for r in rows):
    out = []
    for v in ["base", "new"]:
        x = [r for r in rows if r["cell"] == c and r["provider"] == "diyflash" and r["run"] == "marked pass chunks " + v]
        out.append(f"{v} {statistics.mean(r['tflops'] for r in x):.0f} {statistics.mean(r['vs_peer'] for r in x):.3f}x "
                   f"({','.join(format(r['vs_peer'], '.3f') for r in x)})")
    print(c[:38].ljust(38), " | ".join(out))
PY
echo "ab done at $SECONDS s"
python $D/launches.py head > $OUT/launches_new.txt 2>&1; grep "##\|_kernel\|regs" $OUT/launches_new.txt
for v in base new; do
  p=$PWD; [ $v = base ] && p=$PWD/$D/base:$PWD
  (cd /tmp && TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$p python - $v) <<'PY'
import sys, time, torch
import diyflash
q = torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
t = time.perf_counter(); diyflash.flash_attention(q, q, q, causal=True); torch.cuda.synchronize()
print(sys.argv[1], "first bf16 D128 causal forward (compiles the Hopper forward and its marked pass):",
      f"{time.perf_counter() - t:.2f} s", diyflash.__file__)
PY
done
left=$((575 - SECONDS)); echo "tests b from $SECONDS s, $left s left"
timeout $left python -m pytest -q -p no:cacheprovider -m "not slow" tests/ --ignore=tests/test_registry.py \
  --ignore=tests/test_utils.py --ignore=tests/test_hopper.py --ignore=tests/test_attention_varlen.py \
  --ignore=tests/test_attention_numerics.py > $OUT/tests_b.txt 2>&1; echo "rc=$?"; tail -3 $OUT/tests_b.txt
