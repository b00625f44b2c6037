#!/usr/bin/env bash
# The GPU machine's one call: GPU test suite, config sweep and benchmark; full logs under $OUT.
#   bash bench/device_run.sh [tests] [sweep] [bench] [cells] [variants] [decode] [varlen] [short] [overhead]
#                            [matmul] [coldstart]
#   (default: tests sweep bench)
# The GPU's SM clock, power and temperature are logged every 500 ms to $OUT/clocks.csv throughout.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/diyflash-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d .whl ] && { python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site; }
parts=${*:-tests sweep bench}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
status=0
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 500 > "$OUT/clocks.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
if [[ $parts == *tests* ]]; then
  # on every core where pytest-xdist is there (tests/conftest.py caps the GPU's workers); serially where not
  workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n auto")
  DIYFLASH_TEST_DEVICE=cuda python3 -m pytest -q --maxfail=25 -p no:cacheprovider --durations=10 $workers ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  status=${PIPESTATUS[0]}
fi
if [[ $parts == *sweep* ]]; then  # re-tunes diyflash/kernels/attention_tuned.py (copied to $OUT)
  python3 -m bench.attention_configs --write --out "$OUT/configs.jsonl" ${SWEEP_ARGS:-} 2>&1 | tee -a "$OUT/sweep.log" | grep -v "^  skip"
  cp diyflash/kernels/attention_tuned.py "$OUT/"
fi
if [[ $parts == *bench* ]]; then
  python3 -m bench.attention --out "$OUT/attention.jsonl" --plot "$OUT/attention.png" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60
fi
if [[ $parts == *cells* ]]; then
  python3 -m bench.cells --out "$OUT/cells.jsonl" 2>&1 | tee "$OUT/cells.log" | tail -12
fi
if [[ $parts == *variants* ]]; then
  python3 -m bench.attention_variants --out "$OUT/attention_variants.jsonl" ${VARIANTS_ARGS:-} 2>&1 | tee "$OUT/variants.log" | tail -40
fi
if [[ $parts == *decode* ]]; then
  python3 -m bench.decode --out "$OUT/decode.jsonl" ${DECODE_ARGS:-} 2>&1 | tee "$OUT/decode.log" | tail -20
fi
if [[ $parts == *varlen* ]]; then
  python3 -m bench.varlen --out "$OUT/varlen.jsonl" 2>&1 | tee "$OUT/varlen.log" | tail -12
fi
if [[ $parts == *short* ]]; then
  python3 -m bench.attention --short --providers diyflash sdpa-flash sdpa-cudnn --out "$OUT/attention_short.jsonl" 2>&1 | tee "$OUT/short.log" | tail -60
fi
if [[ $parts == *overhead* ]]; then
  python3 -m bench.overhead 2>&1 | tee "$OUT/overhead.txt"
fi
if [[ $parts == *matmul* ]]; then
  python3 -m bench.matmul --ablation --out "$OUT/matmul.jsonl" --plot "$OUT/matmul.png" 2>&1 | tee "$OUT/matmul.log" | tail -60
fi
if [[ $parts == *coldstart* ]]; then
  python3 -m bench.coldstart --out "$OUT/coldstart.jsonl" ${COLDSTART_ARGS:-} 2>&1 | tee "$OUT/coldstart.log"
fi
echo "tests exit status: $status"
exit $status
