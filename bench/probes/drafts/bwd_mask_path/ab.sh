#!/bin/bash
# (issue 48) Does the Hopper backward's in-loop mask test cost, as the forward's masked path did (run "the causal
# forward's masked path": MHA D64 causal 1.03x cuDNN, built without a masked path 1.11x, with one never taken 1.04x)?
# backward_sm90._mma applies the mask behind `if (start_m < mid) | (start_m >= full_end)` inside its one loop.
# Variants of the module (sed on the kernel, written at run time): nomask = the test's branch removed (wrong outputs
# on the causal cells: an upper bound), never = its test on a value the compiler cannot bound and never true (the
# path built in, never taken). Processes base, never, nomask, base on the causal cells' backward beside cuDNN.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=$(mktemp -d)
SRC=diyflash/kernels/attention/backward_sm90.py
TEST='        if (start_m < mid) | (start_m >= full_end):'
grep -qF "$TEST" $SRC || { echo "the mask test is not in $SRC"; exit 1; }
sed "s/^        if (start_m < mid) | (start_m >= full_end):/        if False:/" $SRC > $T/nomask.py
sed "s/^        if (start_m < mid) | (start_m >= full_end):/        if start_m + q_len < -1:/" $SRC > $T/never.py
PRE="
import sys, importlib.util
if sys.argv[1] != 'base':
    spec = importlib.util.spec_from_file_location('diyflash.kernels.attention.backward_sm90', '$T/' + sys.argv[1] + '.py')
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
"
one() {
  timeout 280 python -c "$PRE
import runpy
sys.argv = ['bench.cells'] + sys.argv[2:]
runpy.run_module('bench.cells', run_name='__main__')" $2 --modes bwd --run "$1" --out $OUT/ab_bwd.jsonl \
    --cells "GQA32/8 D128 causal bf16 B4 N4096" "MHA D64 causal fp16 B2 H16 N8192" "MHA D128 causal fp16 B2 H16 N8192" \
    > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,7,9,10 | sort -u
}
one base-1 base; one never-2 never; one nomask-3 nomask; one base-4 base
