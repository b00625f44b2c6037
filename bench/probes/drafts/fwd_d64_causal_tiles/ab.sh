# (issue 48) head_dim-64 causal forwards (no window) on 128-row tiles, two consumers, in turns or not, 3 or 4
# slots (d64_causal.diff: DIYFLASH_PROBE_D64_CAUSAL = 2t, 2, 2t4), against the kernel's 192-row tiles (head):
# outputs checked bitwise on 14 odd shapes, test_hopper on 2t, then four causal D64 cells in processes in turns.
# From the repository root, OUT set:   bash bench/probes/drafts/fwd_d64_causal_tiles/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
D=bench/probes/drafts/fwd_d64_causal_tiles
git apply $D/d64_causal.diff 2>/dev/null || echo "patch already applied"
TRITON_CACHE_DIR=/tmp/tc_head DIYFLASH_ATTENTION_BACKEND=hopper timeout 120 python3 $D/check.py save /tmp/ref.pt | tail -1
for v in 2t 2 2t4; do echo "check $v"
  DIYFLASH_PROBE_D64_CAUSAL=$v TRITON_CACHE_DIR=/tmp/tc_$v DIYFLASH_ATTENTION_BACKEND=hopper timeout 150 python3 $D/check.py check /tmp/ref.pt | cut -c1-4 | sort | uniq -c
done
DIYFLASH_PROBE_D64_CAUSAL=2t DIYFLASH_TEST_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tc_2t timeout 200 python3 -m pytest -q -n 8 \
  -p no:cacheprovider tests/test_hopper.py tests/test_attention_numerics.py -m "not slow" 2>&1 | tail -2
for v in 2t head 2 2t4 2t4 2 head 2t; do
  DIYFLASH_PROBE_D64_CAUSAL=${v#head} TRITON_CACHE_DIR=/tmp/tc_$v timeout 110 python3 $D/cells.py --modes fwd \
    --run "d64 causal tiles: $v" --out $OUT/d64c.jsonl > $OUT/d64c_$v.log 2>&1; echo "$v rc=$?"
  grep "^| [wGM]" $OUT/d64c_$v.log | sort -u | cut -d'|' -f2,4,5,6 | sed "s/^/$v /"
done
