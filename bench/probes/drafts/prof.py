import os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glbwd_fa3 as g
import diyflash
B, H, Hk, N, D = 1, 32, 8, 16384, 128
gen = torch.Generator(device="cuda").manual_seed(0)
mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
q, k, v, dout = mk(H), mk(Hk), mk(Hk), mk(H)
out, lse = diyflash.flash_attention(q, k, v, causal=True, return_lse=True)
delta, lse2 = g.prep(out, dout, lse)
dq_acc = torch.zeros(q.shape, device="cuda", dtype=torch.float32)
dk, dv = torch.empty_like(k), torch.empty_like(v)
var = g.VARIANTS[os.environ.get("VAR", "fa3_tma2")]
for _ in range(3):
    g.gl_bwd_kernel(q, k, v, dout, delta, lse2, dq_acc, dk, dv, True, **var)
torch.cuda.synchronize()
