"""host per decode call, 32 layers sharing a layout that grows by one key each step (views of one buffer)"""
import os, statistics, time, torch, torch.nn.functional as F, diyflash
from diyflash.kernels import _cplan
on = os.environ.get("DIYFLASH_C_PLANS", "1") != "0"
if on:
    _cplan.ready()
L, B, H, HKV, D, N0 = 32, 1, 32, 8, 128, 8192
q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
kb = [torch.randn(B, HKV, N0 + 600, D, device="cuda", dtype=torch.bfloat16) for _ in range(L)]
def run(fn, steps, n0, every):
    torch.cuda.synchronize(); t0 = time.perf_counter(); n = n0
    for s in range(steps):
        if s % every == 0:
            n += 1
        for l in range(L):
            k = kb[l][:, :, :n]
            fn(q, k, k)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (steps * L) * 1e6
ours = lambda q, k, v: diyflash.flash_attention(q, k, v, causal=True)
sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
res = {}
for every in (1, 32):
    for name, fn in (("ours", ours), ("sdpa", sdpa)):
        run(fn, 20, N0, every)
        res[(name, every)] = statistics.median(run(fn, 16, N0 + 100 * r, every) for r in range(5))
print(f"C_PLANS={'1' if on else '0'} ours grows every call {res[('ours', 1)]:.1f} us (sdpa {res[('sdpa', 1)]:.1f}), "
      f"every 32 calls {res[('ours', 32)]:.1f} us (sdpa {res[('sdpa', 32)]:.1f})")
