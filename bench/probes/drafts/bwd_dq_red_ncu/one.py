"""One Hopper backward launch of MHA fp16 B2 H16 N8192 D128 (not causal) from the diyflash of TREE, between
cudaProfilerStart and Stop, after three warm-up calls: for `ncu --profile-from-start off`."""
import os
import sys

tree = sys.argv[1]
sys.path.insert(0, tree)
import torch  # noqa: E402

import diyflash  # noqa: E402

assert diyflash.__file__.startswith(os.path.abspath(tree)), diyflash.__file__
q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
out = diyflash.flash_attention(q, k, v)
dout = torch.randn_like(out)
for _ in range(3):
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
