"""The dense decode route's host time a call: keys growing every call, every 4 calls (a 4-layer model's
decode step: its layers share the caches' layout), every 32 calls, fixed; fast key off; SDPA."""
import statistics
import torch
import torch.nn.functional as F
import diyflash
import diyflash.api as api
from bench.overhead import host_us

qd = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
kbig, vbig = (torch.randn(1, 8, 8192 + 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
kfix, vfix = kbig[:, :, :8192].contiguous(), vbig[:, :, :8192].contiguous()


def growing(every):
    state = [0]

    def call():
        state[0] += 1
        n = 4097 + (state[0] // every) % 4000
        return diyflash.flash_attention(qd, kbig[:, :, :n], vbig[:, :, :n], False, 0.088)
    return call


fns = dict(dec_sdpa_fixed=lambda: F.scaled_dot_product_attention(qd, kfix, vfix, enable_gqa=True),
           dec_ours_fixed=lambda: diyflash.flash_attention(qd, kfix, vfix),
           dec_ours_grow_1=growing(1), dec_ours_grow_4=growing(4), dec_ours_grow_32=growing(32),
           dec_ours_grow_ordinary=growing(1))
real_key = api.fast_key
for fn in fns.values():
    for _ in range(10):
        fn()
turns = {n: [] for n in fns}
for _ in range(5):
    for n, fn in fns.items():
        if n == "dec_ours_grow_ordinary":
            api.fast_key = lambda *a: None
        try:
            turns[n].append(host_us(fn, reps=40))
        finally:
            api.fast_key = real_key
for n, t in turns.items():
    print(f"{n:<24} {statistics.median(t):7.1f} us")
