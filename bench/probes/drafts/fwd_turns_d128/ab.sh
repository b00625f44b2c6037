#!/bin/bash
# (issue 48) The Hopper forward's consumers in turns (FA3's ping-pong, hopper.Tiles.turns) at head_dim 128 without
# masks, on today's kernel (the FMA form, held rows, the split last round), against the kernel (no turns at D128:
# 0.97-1.00x when measured before those changes, runs "consumers in turns, first look" and "consumers in turns at
# D64"). MHA D128 causal, whose build does not change (turns are for calls without masks), is the processes'
# control. Processes base, turns, turns, base, base, turns; forward only, each provider right after cuDNN.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
C=("MHA D128 full fp16 B2 H16 N8192" "MHA D128 causal fp16 B2 H16 N8192")
one() {
  timeout 120 python -c "
import sys, runpy
import diyflash.kernels.attention.hopper as h
if sys.argv[1] == 'turns':
    h.TILES[128] = h.Tiles(128, 2, turns=True)
sys.argv = ['bench.cells'] + sys.argv[2:]
runpy.run_module('bench.cells', run_name='__main__')" $2 --modes fwd --cells "${C[@]}" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
one base-1 base; one turns-1 turns; one turns-2 turns; one base-2 base; one base-3 base; one turns-3 turns
