# (issue 48; pending: not yet run on a GPU) the Hopper backward at head_dim 64 with dq computed transposed,
# dq^T = k^T ds: each MMA warpgroup holds k^T's two key halves as register A operands (32 registers a thread)
# and computes its 32 query rows of dq, every column, reading only ds from shared memory (B: its rows' 32
# columns of ds^T's buffer) where today's dq reads ds^T and k's columns (A and B: 48 -> 16 KB a step for both
# warpgroups). dq_t.diff (on 2ba05ed) adds it behind DIYFLASH_PROBE_BWD_DQ_T=1 (hopper.BWD_DQ_T, the kernel's
# DQ_T; packed sequences keep today's panels), with the convert pass's transposed order (backward_rows
# `_dq_flat_offset`, tested through the interpreter: tests/test_hopper_backward.py -k flat_dq, 12 passed on CPU).
# Offline sm_90a (Triton 3.6): D64 builds spill 4-8 B (20 B with softcap and a window), nothing serialized.
# Open question for the GPU test: the B slice starts 64 bytes into ds's 128-byte swizzled rows.
# This script: the GPU tests of the backward on the form first, then processes head, dqt, dqt, head beside cuDNN
# on the D64 cells and one D128 cell (unchanged: a control). From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_dq_t/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_dq_t
git apply $D/dq_t.diff 2>/dev/null || patch -p1 < $D/dq_t.diff || echo "patch not applied"
DIYFLASH_PROBE_BWD_DQ_T=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_dqt timeout 240 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py tests/test_hopper.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
CELLS=("MHA D64 full fp16 B2 H16 N8192" "MHA D64 causal fp16 B2 H16 N8192" "GQA32/8 D128 causal bf16 B4 N4096")
for v in head dqt dqt head; do
  DIYFLASH_PROBE_BWD_DQ_T=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 150 python3 -m bench.cells \
    --modes bwd --cells "${CELLS[@]}" --run "bwd dq transposed: $v" --out $OUT/ab_$v$RANDOM.jsonl > $OUT/ab_$v.log 2>&1
  echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/dq_t.diff 2>/dev/null || patch -R -p1 < $D/dq_t.diff
cat $OUT/ab.txt
