# ncu of one Hopper forward launch (MHA D64 full fp16 B2 H16 N8192) with EXP2_EMU = argv[1]; see fwd_exp2_offload.py
import sys, torch
from diyflash.kernels.attention import launch as ka
_L = ka.Launch
emu = int(sys.argv[1])
ka.Launch = lambda fn, grid, ptrs, args, meta: _L(fn, grid, ptrs, args, {**meta, "EXP2_EMU": emu} if "EXP2_EMU" in meta else meta)
B, H, N, D = 2, 16, 8192, 64
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
run = lambda: ka.attention_fwd(q, k, v, False, D ** -0.5, None)
for _ in range(3):
    run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
