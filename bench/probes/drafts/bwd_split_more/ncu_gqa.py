import sys, torch, diyflash
from torch.cuda import cudart
hq = int(sys.argv[1])
torch.manual_seed(0)
mk = lambda h: torch.randn(1, h, 16384, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
q, k, v = mk(hq), mk(8), mk(8)
out = diyflash.flash_attention(q, k, v, causal=True)
do = torch.randn_like(out)
for _ in range(3):
    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
cudart().cudaProfilerStop()
