# (issue 48) the Hopper backward with dk's matmul issued before ds is stored for dq (dk_first.diff:
# DIYFLASH_PROBE_BWD_DK_FIRST=1), so that it runs under the store, the proxy fence and the barrier before the
# ds_ready arrive, against the kernel (head: dk issued after them), beside cuDNN and FlexAttention on six of
# bench.cells' cells, processes head, dk, dk, head; first the GPU fast tier on dk (a line each to $OUT/ab.txt).
# From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_dk_first/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_dk_first
git apply $D/dk_first.diff 2>/dev/null || echo "patch already applied"
DIYFLASH_PROBE_BWD_DK_FIRST=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_dk timeout 380 python3 -m pytest -q -n 16 \
  -p no:cacheprovider -m "not slow" tests/ --ignore=tests/test_registry.py --ignore=tests/test_utils.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
CELLS=("GQA32/8 D128 causal bf16 B4 N4096" "GQA32/8 D128 causal bf16 B1 N16384" "MHA D64 full fp16 B2 H16 N8192"
       "MHA D128 full fp16 B2 H16 N8192" "MHA D128 causal fp16 B2 H16 N8192" "window4096 GQA32/8 D128 causal bf16 B1 N16384")
for v in head dk dk head; do
  DIYFLASH_PROBE_BWD_DK_FIRST=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 80 python3 -m bench.cells --modes bwd \
    --cells "${CELLS[@]}" --run "bwd dk first: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/dk_first.diff
cat $OUT/ab.txt
