#!/bin/bash
# (issue 48) Whether the consumers' softmax should run under the p @ v before it. Built offline, the causal D64
# forward's key loop waits for that p @ v after the softmax (wait(1), then wait(0)); the build without any masked
# path (wrong outputs, 1.11x cuDNN against the kernel's 1.03x) has ptxas wait for both before the softmax, its
# exponentials written into p @ v's operand registers, and no spills. Processes in turns beside cuDNN, the probe
# copy of forward_sm90 (probe_forward_sm90.py; its switches off = the kernel) as
#   base    the kernel
#   serial  a block's q.k^T and the p @ v before it waited for together (PROBE_SERIAL): the same outputs
#   nomask  no block masked (PROBE_NOMASK; wrong outputs): the bound, D64 causal only
# First serial's outputs against base's (bitwise, D64 and D128, odd shapes), then the timings.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_serial_softmax
PRE="
import os, sys, importlib.util
v = sys.argv[1]
os.environ['PROBE_SERIAL'] = '1' if v.startswith('serial') else '0'
os.environ['PROBE_NOMASK'] = '1' if v == 'nomask' else '0'
os.environ['PROBE_D'] = v[len('serial'):] if v.startswith('serial') and len(v) > 6 else '0'
spec = importlib.util.spec_from_file_location('diyflash.kernels.attention.forward_sm90', '$D/probe_forward_sm90.py')
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
"
for v in base serial; do
  DIYFLASH_ATTENTION_BACKEND=hopper timeout 300 python -c "$PRE
import torch, diyflash
out = {}
g = torch.Generator(device='cuda').manual_seed(0)
for d in (64, 128):
    for (b, hq, hk, nq, nk, dt, causal, win) in [(2, 4, 4, 1000, 1000, torch.float16, True, None),
            (1, 8, 2, 3000, 3000, torch.bfloat16, True, None), (1, 4, 1, 700, 1500, torch.float16, True, None),
            (2, 2, 2, 4096, 4096, torch.float16, True, None), (2, 4, 4, 1000, 1000, torch.float16, False, None),
            (1, 8, 2, 2048, 2048, torch.bfloat16, False, None), (1, 4, 4, 3000, 3000, torch.float16, True, 700)]:
        q = torch.randn(b, hq, nq, d, device='cuda', dtype=dt, generator=g)
        k, vv = (torch.randn(b, hk, nk, d, device='cuda', dtype=dt, generator=g) for _ in range(2))
        kw = dict(window_size=(win, 0)) if win else {}
        o, lse = diyflash.flash_attention(q, k, vv, causal=causal, return_lse=True, **kw)
        out[(d, b, hq, hk, nq, nk, causal, win)] = (o.cpu(), lse.cpu())
torch.save(out, '$OUT/bits_' + v + '.pt')" $v 2>&1 | tail -2
done
python -c "
import torch
a = torch.load('$OUT/bits_base.pt'); b = torch.load('$OUT/bits_serial.pt')
print('serial bitwise equal to base:', all(torch.equal(a[k][0], b[k][0]) and torch.equal(a[k][1], b[k][1]) for k in a), len(a))"
one() {
  timeout 200 python -c "$PRE
import runpy
sys.argv = ['bench.cells'] + sys.argv[2:]
runpy.run_module('bench.cells', run_name='__main__')" $2 --modes fwd ${3:+--cells "$3"} --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
i=0
for v in ${RUNS:-base serial serial base}; do i=$((i+1)); one $v-$i $v; done
for v in ${NOMASK_RUNS:-nomask}; do i=$((i+1)); one $v-$i $v "MHA D64 causal fp16 B2 H16 N8192"; done
