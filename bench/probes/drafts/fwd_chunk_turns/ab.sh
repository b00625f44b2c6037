#!/bin/bash
# (issue 48) The Hopper forward's consumers taking a tile's row chunks in turn (the n-th tile's chunk
# (WHICH + n) % CONSUMERS) against each consumer keeping its chunk (base_forward_sm90.py: the kernel before).
# At D64, a causal 192-row tile over 128-key blocks gives its last chunk one key block more than its first (the
# first two chunks on even tiles, 3k+1 against 3k+2 blocks; the first one on odd tiles, 3k+2 against 3k+3), so a
# consumer that keeps its chunk does about a block a tile more than another (~1/32 of a tile's blocks at N8192),
# and the slots let the others run at most STAGES - 1 blocks ahead. D64 full (every chunk the same blocks) and
# D128 causal (128-row tiles: both chunks end in the same block) are the controls.
# First the outputs of both kernels on odd shapes (bitwise: each row's operations are the same), then processes
# base, rot, rot, base, base, rot beside cuDNN, forward only.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_chunk_turns
PRE="
import sys, importlib.util
if sys.argv[1] == 'base':
    spec = importlib.util.spec_from_file_location('diyflash.kernels.attention.forward_sm90', '$D/base_forward_sm90.py')
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
"
for v in base rot; do
  DIYFLASH_ATTENTION_BACKEND=hopper timeout 200 python -c "$PRE
import torch, diyflash
out = {}
g = torch.Generator(device='cuda').manual_seed(0)
for (b, h, hk, nq, nk, d, causal, win, dt) in [(2, 4, 4, 1000, 1000, 64, True, None, torch.float16),
        (1, 8, 2, 3000, 3000, 64, True, None, torch.bfloat16), (2, 4, 4, 1111, 1111, 64, False, None, torch.float16),
        (1, 4, 1, 700, 1500, 64, True, None, torch.float16), (2, 4, 4, 2000, 2000, 64, True, (300, 0), torch.float16),
        (2, 4, 2, 1000, 1000, 128, True, None, torch.bfloat16), (1, 2, 2, 4500, 4500, 128, False, None, torch.float16)]:
    q = torch.randn(b, h, nq, d, device='cuda', dtype=dt, generator=g)
    k, v = (torch.randn(b, hk, nk, d, device='cuda', dtype=dt, generator=g) for _ in range(2))
    o, lse = diyflash.flash_attention(q, k, v, causal=causal, window_size=win or (-1, -1), return_lse=True)
    out[(b, h, hk, nq, nk, d, causal, win)] = (o.cpu(), lse.cpu())
torch.save(out, '$OUT/bits_' + sys.argv[1] + '.pt')
print(sys.argv[1], 'saved', len(out))" $v 2>&1 | tail -3
done
python -c "
import torch
a, b = torch.load('$OUT/bits_base.pt'), torch.load('$OUT/bits_rot.pt')
for key in a:
    print(key, 'out equal', torch.equal(a[key][0], b[key][0]), 'lse equal', torch.equal(a[key][1], b[key][1]))"
C=("MHA D64 causal fp16 B2 H16 N8192" "MHA D64 full fp16 B2 H16 N8192" "MHA D128 causal fp16 B2 H16 N8192")
one() {
  timeout 120 python -c "$PRE
import runpy
sys.argv = ['bench.cells'] + sys.argv[2:]
runpy.run_module('bench.cells', run_name='__main__')" $2 --modes fwd --cells "${C[@]}" --run "$1" --out $OUT/ab.jsonl > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep '^| [GMw]' $OUT/$1.txt | cut -d"|" -f2,3,5,6 | sort -u
}
one base-1 base; one rot-1 rot; one rot-2 rot; one base-2 base; one base-3 base; one rot-3 rot
