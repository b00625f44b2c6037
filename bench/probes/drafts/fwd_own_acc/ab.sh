# (issue 48) the Hopper forward with each finished tile's accumulator copied into registers of its own before it
# is held across the next tile's first q.k^T (own_acc.diff: DIYFLASH_PROBE_FWD_OWN_ACC=1): Triton 3.6's ptxas
# injected a wait for that q.k^T where the held rows are first used (C7517, every causal head_dim-128 build,
# offline sm_90a), against the kernel (head), beside cuDNN on two causal D128 cells, processes head, own, own,
# head; first the outputs of both forms compared bit for bit (bits.py), last tests/test_hopper.py on own.
# From the repository root, OUT set:
#   bash bench/probes/drafts/fwd_own_acc/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_own_acc
git apply $D/own_acc.diff 2>/dev/null || echo "patch already applied"
for v in head own; do
  DIYFLASH_PROBE_FWD_OWN_ACC=$([ $v = head ] || echo 1) DIYFLASH_ATTENTION_BACKEND=hopper TRITON_CACHE_DIR=/tmp/tc_$v \
    timeout 40 python3 $D/bits.py $OUT/bits_$v.pt > $OUT/bits_$v.log 2>&1; echo "bits $v rc=$?" >> $OUT/ab.txt
done
python3 -c "
import torch; a = torch.load('$OUT/bits_head.pt'); b = torch.load('$OUT/bits_own.pt')
print('bitwise equal (out, lse):', all(torch.equal(x, y) for key in a for x, y in zip(a[key], b[key])), len(a), 'shapes')" >> $OUT/ab.txt 2>&1
CELLS=("GQA32/8 D128 causal bf16 B4 N4096" "MHA D128 causal fp16 B2 H16 N8192")
for v in head own own head; do
  DIYFLASH_PROBE_FWD_OWN_ACC=$([ $v = head ] || echo 1) TRITON_CACHE_DIR=/tmp/tc_$v timeout 45 python3 -m bench.cells --modes fwd \
    --cells "${CELLS[@]}" --run "fwd own acc: $v" --out $OUT/ab.jsonl > $OUT/ab_$v.log 2>&1; echo "$v rc=$?" >> $OUT/ab.txt
  grep "^| [wGM]" $OUT/ab_$v.log | sort -u | cut -d'|' -f2,3,5,6 | sed "s/^/$v /" >> $OUT/ab.txt
done
cat $OUT/ab.txt
DIYFLASH_PROBE_FWD_OWN_ACC=1 DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_own timeout 60 python3 -m pytest -q -n 16 \
  -p no:cacheprovider tests/test_hopper.py -m "not slow" -x > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/tests.log
git apply -R $D/own_acc.diff
