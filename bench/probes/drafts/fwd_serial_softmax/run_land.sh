#!/bin/bash
# (issue 48) serial.patch landed with the softcap's product rounded on its own: the GPU tests it touches (the
# Hopper files whole, every softcap test of the attention files), then the headline cells (run "cells N").
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
DIYFLASH_TEST_DEVICE=cuda timeout 300 python -m pytest -q -n 8 -p no:cacheprovider tests/test_hopper.py \
  tests/test_hopper_builds.py > $OUT/gpu_tests.txt 2>&1; echo "hopper tests rc=$?"; tail -4 $OUT/gpu_tests.txt
DIYFLASH_TEST_DEVICE=cuda timeout 200 python -m pytest -q -n 8 -p no:cacheprovider tests/test_hopper_backward.py \
  tests/test_attention_variants.py tests/test_attention_fast.py tests/test_attention_kvcache.py \
  tests/test_attention_varlen.py -k softcap > $OUT/gpu_softcap.txt 2>&1; echo "softcap tests rc=$?"; tail -4 $OUT/gpu_softcap.txt
left=$((585 - SECONDS)); echo "cells get ${left}s"
timeout $left python -m bench.cells --run "$1" --out $OUT/cells.jsonl > $OUT/cells.txt 2>&1; echo "cells rc=$?"
grep '^|' $OUT/cells.txt | tail -30
