export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
F=diyflash/kernels/attention/backward_sm90.py
DIYFLASH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -n 16 -p no:cacheprovider -m "not slow" tests/test_hopper.py tests/test_hopper_backward.py > $OUT/tests.txt 2>&1; echo "tests rc=$?"; tail -1 $OUT/tests.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head
for v in hyb old hyb; do cp .probe2/backward_sm90_$v.py $F
timeout 45 python3 -m bench.attention --shapes 2x16x128 --n 8192 --dtypes fp16 --causal true --modes bwd --providers diyflash sdpa-cudnn > $OUT/m_$v.txt 2>&1
timeout 45 python3 -m bench.attention --shapes 1x32x128 --kv-heads 8 --n 16384 --dtypes bf16 --causal true --modes bwd --providers diyflash sdpa-cudnn > $OUT/g_$v.txt 2>&1
echo "$v $(grep '^| 2 16' $OUT/m_$v.txt | cut -d'|' -f7,9,13) $(grep '^| 1 32' $OUT/g_$v.txt | cut -d'|' -f7,9,13)"; done
cp .probe2/backward_sm90_hyb.py $F
