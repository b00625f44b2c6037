#!/bin/bash
# (issue 48) How much the consumers' turns could give causal head_dim-64 forwards if their rhythm held: on MHA D64
# causal fp16 B2 H16 N8192, processes in turns beside cuDNN, the probe copy of forward_sm90 (probe_forward_sm90.py;
# its switches off = the kernel) as
#   base        the kernel (own bands, passed blocks, no turns on causal calls)
#   turns       turns forced (hopper.Tiles.meta's TURNS): ncu had 620 -> 635 us, the ring's waits 2.9 % of samples
#   whole       every consumer walks the tile's whole band (PROBE_WHOLE: no passed blocks; blocks past its rows'
#               diagonal masked whole), no turns; the same outputs
#   whole_turns that, in turns: every consumer the same blocks, each its own diagonal's masks; the same outputs
#   bound       whole_turns without any mask (PROBE_NOMASK): wrong outputs, the rhythm's bound
#   nomask      the kernel without any mask (PROBE_NOMASK; wrong outputs); never: the masked path compiled in but
#               never taken (PROBE_NEVER; wrong outputs): whether the masks cost by running or by being there
#   tile_turns  whole_turns with the tile's masked blocks for every consumer (PROBE_WHOLE=2: every consumer masks
#               the blocks any of the tile's rows needs masked); tile: the same without turns; the same outputs
# First each correct variant's outputs against base's (bitwise), then the timings.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_causal_turns_bound
PRE="
import os, sys, importlib.util
v = sys.argv[1]
os.environ['PROBE_WHOLE'] = '2' if v.startswith('tile') else '1' if v in ('whole', 'whole_turns', 'bound') else '0'
os.environ['PROBE_NOMASK'] = '1' if v in ('bound', 'nomask') else '0'
os.environ['PROBE_NEVER'] = '1' if v == 'never' else '0'
spec = importlib.util.spec_from_file_location('diyflash.kernels.attention.forward_sm90', '$D/probe_forward_sm90.py')
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
import diyflash.kernels.attention.hopper as h
if v in ('turns', 'whole_turns', 'bound', 'tile_turns'):
    meta = h.Tiles.meta
    def forced(self, n_k, banded):
        m = meta(self, n_k, banded)
        m['TURNS'] = self.turns
        return m
    h.Tiles.meta = forced
"
for v in ${BITS:-base turns whole whole_turns}; do
  DIYFLASH_ATTENTION_BACKEND=hopper timeout 200 python -c "$PRE
import torch, diyflash
out = {}
g = torch.Generator(device='cuda').manual_seed(0)
for (b, hq, hk, nq, nk, dt) in [(2, 4, 4, 1000, 1000, torch.float16), (1, 8, 2, 3000, 3000, torch.bfloat16),
                                (1, 4, 1, 700, 1500, torch.float16), (2, 2, 2, 4096, 4096, torch.float16)]:
    q = torch.randn(b, hq, nq, 64, device='cuda', dtype=dt, generator=g)
    k, vv = (torch.randn(b, hk, nk, 64, device='cuda', dtype=dt, generator=g) for _ in range(2))
    o, lse = diyflash.flash_attention(q, k, vv, causal=True, return_lse=True)
    out[(b, hq, hk, nq, nk)] = (o.cpu(), lse.cpu())
torch.save(out, '$OUT/bits_' + v + '.pt')" $v 2>&1 | tail -2
done
python -c "
import torch
a = torch.load('$OUT/bits_base.pt')
for v in '${BITS:-base turns whole whole_turns}'.split()[1:]:
    b = torch.load('$OUT/bits_' + v + '.pt')
    print(v, all(torch.equal(a[k][0], b[k][0]) and torch.equal(a[k][1], b[k][1]) for k in a))"
one() {
  timeout 120 python -c "$PRE
import runpy
sys.argv = ['bench.cells'] + sys.argv[2:]
runpy.run_module('bench.cells', run_name='__main__')" $2 --modes fwd --cells "MHA D64 causal fp16 B2 H16 N8192" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
i=0
for v in ${RUNS:-base turns whole whole_turns bound base bound whole_turns whole turns}; do i=$((i+1)); one $v-$i $v; done
