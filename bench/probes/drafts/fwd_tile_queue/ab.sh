#!/bin/bash
# (issue 48) UNFINISHED probe, kept for the next stop: the causal Hopper forward taking its tiles from a queue (a
# global counter each program's loader draws from, heavy tiles first in each head group; queue.diff, against 4655923)
# against the static deal, bench.cells' causal forward cells, processes base, dyn, dyn, base. Its offline sm_90a builds
# compile (spills 32 -> 96 B at D128 causal, 84 -> 116 B at D64 causal); on the H200 its first, unplanned calls passed
# test_hopper's both-backends tests, but every planned call failed (KeyError 'tile_counter'): the eager fast path
# (kernels/attention/fast.py, _FORWARD_ALLOCS) builds a planned call's env without the counter, so no timing came
# back. Before measuring: give that env the counter. Before adopting: a counter per stream (one per device is shared
# by concurrent calls on two streams), the static and queue loops' bodies made one, test_persistent_programs_take_every_tile
# bit for bit. ncu bounds its gain at 2.8 % (D64 causal), 1.1-1.6 % (D128 causal): results/fwd_sm_balance_h200.txt.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
echo "tree has _queue_draw: $(grep -c _queue_draw diyflash/kernels/attention/forward_sm90.py); base: $(grep -c _queue_draw DRAFT/base/diyflash/kernels/attention/forward_sm90.py)"
echo skip tests
R=$PWD
C=("GQA32/8 D128 causal bf16 B4 N4096" "MHA D64 causal fp16 B2 H16 N8192" "MHA D128 causal fp16 B2 H16 N8192")
one() {
  (cd $2 && PYTHONPATH=$2 timeout 80 python -m bench.cells --modes fwd --cells "${C[@]}" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1)
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6
}
one base1 $R/DRAFT/base
one dyn1 $R
one dyn2 $R
one base2 $R/DRAFT/base
