"""Where issue 47's fwd+bwd cell spends its host time: the same-run breakdown against SDPA and an identity
autograd.Function (the Python autograd floor), and the dense decode route before/after (fast path)."""
import statistics
import torch
import torch.nn.functional as F
import diyflash
from bench.overhead import host_us
from diyflash.kernels.attention import fast as kfast
from diyflash.ops import attention_fast

q = torch.randn(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16)
qg = q.detach().requires_grad_()
g = torch.randn_like(q)


class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c):
        ctx.save_for_backward(a, b, c)
        return a.new_empty(a.shape), a.new_empty(a.shape[:-1], dtype=torch.float32)

    @staticmethod
    def backward(ctx, do, dl):
        a, b, c = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b), torch.empty_like(c)


fns = dict(
    fb_sdpa=lambda: torch.autograd.grad(F.scaled_dot_product_attention(qg, qg, qg), qg, g),
    fb_ours=lambda: torch.autograd.grad(diyflash.flash_attention(qg, qg, qg), qg, g),
    fb_ident=lambda: torch.autograd.grad(Ident.apply(qg, qg, qg)[0], qg, g),
    f_ident=lambda: Ident.apply(qg, qg, qg),
    f_ours_grad=lambda: diyflash.flash_attention(qg, qg, qg),
    f_sdpa_grad=lambda: F.scaled_dot_product_attention(qg, qg, qg),
    f_ours=lambda: diyflash.flash_attention(q, q, q),
)
qd = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
kbig, vbig = (torch.randn(1, 8, 8192 + 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
kfix, vfix = kbig[:, :, :8192].contiguous(), vbig[:, :, :8192].contiguous()
step = [4096]


def dec_grow():
    step[0] = 4096 + (step[0] + 1 - 4096) % 4096
    return diyflash.flash_attention(qd, kbig[:, :, :step[0]], vbig[:, :, :step[0]], False, 0.088)


fns["dec_sdpa_fixed"] = lambda: F.scaled_dot_product_attention(qd, kfix, vfix, enable_gqa=True)
fns["dec_ours_fixed"] = lambda: diyflash.flash_attention(qd, kfix, vfix)
fns["dec_ours_grow"] = dec_grow
fns["dec_ours_grow_ordinary"] = dec_grow
import diyflash.api as api
real_key = api.fast_key
for fn in fns.values():
    for _ in range(5):
        fn()
(entry,) = [e for k, e in attention_fast._FAST.items() if e is not None and k[0] == q.shape]
(bwd,) = entry[0].backwards.values()
out, lse = entry[0](q, q, q)
fns["bwd_replay_alone"] = lambda: bwd(g, q, q, q, out, lse)
real = kfast.FastBackward.__call__
fns["fb_ours_no_replay"] = lambda: torch.autograd.grad(diyflash.flash_attention(qg, qg, qg), qg, g)


def no_replay(self, dout, q_, k_, v_, out_, lse_):
    return torch.empty_like(q_), torch.empty_like(k_), torch.empty_like(v_)


turns = {n: [] for n in fns}
for _ in range(5):
    for n, fn in fns.items():
        if n == "fb_ours_no_replay":
            kfast.FastBackward.__call__ = no_replay
        if n == "dec_ours_grow_ordinary":
            api.fast_key = lambda *a: None
        try:
            turns[n].append(host_us(fn, reps=40))
        finally:
            kfast.FastBackward.__call__ = real
            api.fast_key = real_key
for n, t in turns.items():
    print(f"{n:<20} {statistics.median(t):7.1f} us")
