# (issue 48) the Hopper backward at head_dim 64 with the next step's s^T issued behind this step's dq (NEXT_ST; ncu of
# the D64 backward after the dq split has dq's wait before its store among a step's largest:
# bench/results/bwd_ncu_stalls_h200.txt). next_st.diff (on 1ce26d3's kernel) adds the form behind the kernel's NEXT_ST
# and turns it on by DIYFLASH_PROBE_BWD_NEXT_ST=1 (D64 only; the D128 kernel's stats in the accumulators would need
# the next stage's lse). The next s^T is waited for after dq's store, so that no wgmma is in flight across the loop
# (with it, ptxas serialized every wgmma: C7514). Offline sm_90a (Triton 3.6): the D64 builds spill 0 B, no warnings;
# the SASS issues the 4 s^T HGMMA behind dq's second share, before dq's wait (DEPBAR 1). Not yet run on a GPU. This script: the backward's GPU tests on the
# form, then processes head, next, next, head beside cuDNN on the two MHA D64 cells. From the repository root, OUT set:
#   bash bench/probes/drafts/bwd_next_st/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/bwd_next_st
git apply $D/next_st.diff || echo "patch not applied"
DIYFLASH_PROBE_BWD_NEXT_ST=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc timeout 130 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper_backward.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/ab.txt; tail -1 $OUT/tests.log >> $OUT/ab.txt; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -5 >> $OUT/ab.txt
CELLS=("MHA D64 full fp16 B2 H16 N8192" "MHA D64 causal fp16 B2 H16 N8192")
for v in head next next head; do
  DIYFLASH_PROBE_BWD_NEXT_ST=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc timeout 90 python3 -m bench.cells \
    --modes bwd --cells "${CELLS[@]}" --run "bwd next st: $v" --out $OUT/ab_$v$RANDOM.jsonl > $OUT/ab_$v.log 2>&1
  echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,7,9,10 | sed "s/^/$v /" >> $OUT/ab.txt
done
git apply -R $D/next_st.diff
cat $OUT/ab.txt
