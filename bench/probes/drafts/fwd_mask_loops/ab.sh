#!/bin/bash
# (issue 48) The Hopper forward's key blocks in three loops (masked head, unmasked middle, masked tail; the pipeline's
# state carried across them) instead of one loop whose body holds both softmaxes and picks one a block: run "the causal
# forward's masked path" had MHA D64 causal built without a masked path at 1.11x cuDNN, with one built in but never
# taken 1.04x, the kernel 1.03x. Offline sm_90a (Triton 3.6): the D64 causal hot loop 973 -> 454 instructions a warp,
# the masked loops 766-807 (28-30 spill instructions in two consumers' tails); D128 causal 1039-1044 -> 512.
# (The patch is the form that would land: one loop helper, _next_block, over three ranges; a head loop only with windows.)
# loops.patch: the change against forward_sm90.py (apply.py writes the probe module from it).
# Stages (PROBE_STAGES, default all): bits = the probe's outputs against the kernel's on odd shapes (the same
# operations a block: bitwise); ab = processes base, loops, loops, base on every headline cell's forward beside cuDNN;
# tests = tests/test_hopper.py's GPU tests with the probe module in place of the kernel's.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_mask_loops
M=$(mktemp -d)/probe_forward_sm90.py  # the kernel with loops.patch applied
python $D/apply.py $M || exit 1
PRE="
import sys, importlib.util
if sys.argv[1] == 'loops':
    spec = importlib.util.spec_from_file_location('diyflash.kernels.attention.forward_sm90', '$M')
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
"
S=${PROBE_STAGES:-bits ab tests}
if [[ $S == *bits* ]]; then
for v in base loops; do
  DIYFLASH_ATTENTION_BACKEND=hopper timeout 300 python -c "$PRE
import torch, diyflash
out = {}
g = torch.Generator(device='cuda').manual_seed(0)
cases = [(2, 4, 4, 1000, 1000, 64, True, None, 0.0, torch.float16), (1, 8, 2, 3000, 3000, 64, True, None, 0.0, torch.bfloat16),
         (1, 4, 1, 700, 1500, 64, True, None, 0.0, torch.float16), (2, 4, 4, 2000, 2000, 64, True, (300, 0), 0.0, torch.float16),
         (2, 4, 4, 1111, 1111, 64, False, None, 0.0, torch.float16), (2, 4, 2, 1000, 1000, 128, True, None, 0.0, torch.bfloat16),
         (1, 2, 2, 4500, 4500, 128, False, None, 0.0, torch.float16), (1, 4, 2, 3000, 3000, 128, True, (700, 0), 0.0, torch.bfloat16),
         (1, 4, 4, 1500, 900, 128, True, None, 0.0, torch.float16), (2, 4, 4, 1200, 1200, 64, False, (200, 100), 0.0, torch.float16),
         (1, 4, 4, 2048, 2048, 128, True, None, 30.0, torch.bfloat16), (1, 4, 4, 1000, 1000, 64, False, (128, 64), 20.0, torch.float16)]
for (b, h, hk, nq, nk, d, causal, win, cap, dt) in cases:
    q = torch.randn(b, h, nq, d, device='cuda', dtype=dt, generator=g)
    k, v = (torch.randn(b, hk, nk, d, device='cuda', dtype=dt, generator=g) for _ in range(2))
    o, lse = diyflash.flash_attention(q, k, v, causal=causal, window_size=win or (-1, -1), softcap=cap, return_lse=True)
    out[(b, h, hk, nq, nk, d, causal, win, cap)] = (o.cpu(), lse.cpu())
torch.save(out, '$OUT/bits_' + sys.argv[1] + '.pt')
print(sys.argv[1], 'saved', len(out))" $v 2>&1 | tail -3
done
python -c "
import torch
a, b = torch.load('$OUT/bits_base.pt'), torch.load('$OUT/bits_loops.pt')
for key in a:
    print(key, 'out equal', torch.equal(a[key][0], b[key][0]), 'lse equal', torch.equal(a[key][1], b[key][1]))"
fi
if [[ $S == *ab* ]]; then
one() {
  timeout 200 python -c "$PRE
import runpy
sys.argv = ['bench.cells'] + sys.argv[2:]
runpy.run_module('bench.cells', run_name='__main__')" $2 --modes fwd --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
one base-1 base; one loops-2 loops; one loops-3 loops; one base-4 base
fi
if [[ $S == *tests* ]]; then
  DIYFLASH_TEST_DEVICE=cuda timeout 560 python -c "$PRE
import pytest
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'not slow', 'tests/test_hopper.py']))" loops > $OUT/tests.txt 2>&1
  echo "== tests rc=$?"; tail -3 $OUT/tests.txt
fi
