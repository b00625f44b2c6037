# one Hopper backward launch of a headline cell, after warm-up calls, for ncu (the cell by argv[1])
import sys, torch, diyflash
cells = {
    "mha_d64_causal": (2, 16, 16, 8192, 64, torch.float16, True),
    "mha_d64_full": (2, 16, 16, 8192, 64, torch.float16, False),
    "mha_d128_causal": (2, 16, 16, 8192, 128, torch.float16, True),
    "mha_d128_full": (2, 16, 16, 8192, 128, torch.float16, False),
    "gqa_b1_n16384": (1, 32, 8, 16384, 128, torch.bfloat16, True),
    "gqa64_b1_n16384": (1, 64, 8, 16384, 128, torch.bfloat16, True),
    "gqa_b4_n4096": (4, 32, 8, 4096, 128, torch.bfloat16, True),
}
b, hq, hk, n, d, dt, causal = cells[sys.argv[1]]
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, hq, n, d, device="cuda", dtype=dt, generator=g, requires_grad=True)
k = torch.randn(b, hk, n, d, device="cuda", dtype=dt, generator=g, requires_grad=True)
v = torch.randn(b, hk, n, d, device="cuda", dtype=dt, generator=g, requires_grad=True)
do = torch.randn(b, hq, n, d, device="cuda", dtype=dt, generator=g)
out = diyflash.flash_attention(q, k, v, causal=causal)
for _ in range(3):
    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
