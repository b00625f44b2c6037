"""Outputs and lse of the Hopper forward on 14 odd shapes: save (base) or compare bitwise (variant)."""
import sys, torch, diyflash
from diyflash.kernels.attention import hopper
mode, path = sys.argv[1], sys.argv[2]
SH = [(2,4,4,1000,1000,128,False,None,torch.float16,0.0), (2,4,4,1000,1000,128,True,None,torch.bfloat16,0.0),
      (1,8,2,777,1500,128,True,None,torch.bfloat16,0.0), (1,8,2,1500,777,128,True,None,torch.float16,0.0),
      (1,4,4,2048,2048,128,True,(256,0),torch.bfloat16,0.0), (1,4,4,1024,1024,128,True,None,torch.bfloat16,30.0),
      (2,4,4,1000,1000,64,False,None,torch.float16,0.0), (2,4,4,1000,1000,64,True,None,torch.bfloat16,0.0),
      (1,8,2,777,1500,64,True,None,torch.float16,0.0), (1,4,4,2048,2048,64,True,(300,0),torch.bfloat16,0.0),
      (1,2,2,17,113,128,True,None,torch.float16,0.0), (1,2,2,1,1,64,False,None,torch.float16,0.0),
      (3,16,16,4096,4096,128,True,None,torch.float16,0.0), (1,32,8,8192,8192,128,True,None,torch.bfloat16,0.0)]
res = []
for i, (b,h,hk,nq,nk,d,causal,win,dt,cap) in enumerate(SH):
    g = torch.Generator(device="cuda").manual_seed(i)
    q = torch.randn(b,h,nq,d, device="cuda", dtype=dt, generator=g)
    k = torch.randn(b,hk,nk,d, device="cuda", dtype=dt, generator=g)
    v = torch.randn(b,hk,nk,d, device="cuda", dtype=dt, generator=g)
    out, lse = diyflash.flash_attention(q, k, v, causal=causal, window_size=win or (-1,-1), softcap=cap, return_lse=True)
    torch.cuda.synchronize()
    res.append((out.cpu(), lse.cpu()))
if mode == "save":
    torch.save(res, path); print("saved", len(res))
else:
    ref = torch.load(path)
    for s, (o, l), (ro, rl) in zip(SH, res, ref):
        print("same" if torch.equal(o, ro) and torch.equal(l.nan_to_num(), rl.nan_to_num()) else
              f"DIFF {(o.float()-ro.float()).abs().max().item():.3e}", s[:9])
