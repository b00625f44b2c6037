# (issue 48) the Hopper forward's consumers in turns on every head_dim-64 call, on the key blocks all consumers'
# rows see (shared_turns.diff: _turn_range), against the kernel (turns only without masks): outputs checked
# bitwise on 14 odd shapes, the turns tests, then the D64 cells in processes new, head, head, new. From the
# repository root, OUT set:   bash bench/probes/drafts/fwd_turns_shared/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_turns_shared
A=diyflash/kernels/attention
mkdir -p /tmp/head /tmp/new && cp $A/forward_sm90.py $A/hopper.py /tmp/head/
git apply $D/shared_turns.diff && cp $A/forward_sm90.py $A/hopper.py /tmp/new/
put() { cp /tmp/$1/forward_sm90.py /tmp/$1/hopper.py $A/; }
put head; TRITON_CACHE_DIR=/tmp/tc_head DIYFLASH_ATTENTION_BACKEND=hopper timeout 120 python3 $D/check.py save /tmp/ref.pt
put new; TRITON_CACHE_DIR=/tmp/tc_new DIYFLASH_ATTENTION_BACKEND=hopper timeout 150 python3 $D/check.py check /tmp/ref.pt
DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_new timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_hopper.py -k "turns or persistent or both_backends"
for v in new head head new; do put $v
  TRITON_CACHE_DIR=/tmp/tc_$v timeout 110 python3 $D/cells_d64.py --modes fwd --run "turns on shared blocks: $v" --out $OUT/pp_ab3.jsonl > $OUT/pp3_$v.log 2>&1
  grep "^| [wGM]" $OUT/pp3_$v.log | sort -u | cut -d'|' -f2,4,5,6 | sed "s/^/$v /"
done
put head
