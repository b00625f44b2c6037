# one Hopper forward call of a non-causal headline cell (its kernel and the merge launch), after warm-up calls,
# for ncu (the cell by argv[1])
import sys

import torch

import diyflash

cells = {"mha_d64_full": (2, 16, 16, 8192, 64, torch.float16), "mha_d128_full": (2, 16, 16, 8192, 128, torch.float16)}
b, hq, hk, n, d, dt = cells[sys.argv[1]]
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dt, generator=g) for h in (hq, hk, hk))
for _ in range(3):
    diyflash.flash_attention(q, k, v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
diyflash.flash_attention(q, k, v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
