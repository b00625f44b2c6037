"""Where the replayed backward's host time goes inside autograd (~90 us) against alone (~32 us): a timeline
of grad() (main thread) and the backward (engine's device thread), for ours, SDPA and an identity Function."""
import cProfile, io, pstats, statistics, sys, threading, time
import torch
import torch.nn.functional as F
import diyflash
from bench.overhead import host_us
from diyflash.kernels.attention import fast as kfast
from diyflash.ops import attention_fast
from diyflash.kernels import _launch

pc = time.perf_counter_ns
B, H, N, D = 1, 32, 128, 128
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
g = torch.randn_like(q)

class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c):
        ctx.save_for_backward(a, b, c)
        return a.new_empty(a.shape), a.new_empty(a.shape[:-1], dtype=torch.float32)
    @staticmethod
    def backward(ctx, do, dl):
        T["b0"].append(pc())
        a, b, c = ctx.saved_tensors
        r = torch.empty_like(a), torch.empty_like(b), torch.empty_like(c)
        T["b1"].append(pc())
        return r

T = {"b0": [], "b1": [], "r0": [], "r1": []}
FE = attention_fast._FastEagerAttention
real_bwd = FE.backward
def bwd(ctx, dout, dlse):
    T["b0"].append(pc())
    r = real_bwd(ctx, dout, dlse)
    T["b1"].append(pc())
    return r
FE.backward = staticmethod(bwd)
real_call = kfast.FastBackward.__call__
def call(self, *a):
    T["r0"].append(pc())
    r = real_call(self, *a)
    T["r1"].append(pc())
    return r
kfast.FastBackward.__call__ = call
fires = {}
real_fire = _launch._c_fire
def fire(*a, **kw):
    r = real_fire(*a, **kw)
    key = (threading.current_thread().name, r)
    fires[key] = fires.get(key, 0) + 1
    return r
_launch._c_fire = fire

def timeline(name, fwd, reps=300):
    for _ in range(30):
        torch.autograd.grad(fwd()[0] if isinstance(fwd(), tuple) else fwd(), (qg, kg, vg), g)
    torch.cuda.synchronize()
    rows = []
    for i in range(reps):
        for key in T: T[key].clear()
        out = fwd()
        if isinstance(out, tuple): out = out[0]
        t0 = pc()
        torch.autograd.grad(out, (qg, kg, vg), g)
        t1 = pc()
        if i % 20 == 0: torch.cuda.synchronize()
        b0, b1 = (T["b0"] or [t0])[0], (T["b1"] or [t1])[0]
        r = (T["r1"][0] - T["r0"][0]) if T["r0"] else 0
        rows.append((b0 - t0, b1 - b0, t1 - b1, r, t1 - t0))
    med = [statistics.median(c) / 1e3 for c in zip(*rows)]
    print(f"{name:<28} to-bwd {med[0]:6.1f}  bwd-body {med[1]:6.1f} (replay {med[3]:5.1f})  after {med[2]:6.1f}  grad() {med[4]:6.1f} us")

fwd_ours = lambda: diyflash.flash_attention(qg, kg, vg)
fwd_sdpa = lambda: F.scaled_dot_product_attention(qg, kg, vg)
fwd_id = lambda: Ident.apply(qg, kg, vg)
for _ in range(3):
    timeline("ours", fwd_ours)
    timeline("sdpa", fwd_sdpa)
    timeline("identity Function", fwd_id)
print("C launcher fires (thread, launched):", fires)
entry = [e for kk, e in attention_fast._FAST.items() if e is not None and kk[0] == q.shape][0]
(fb,) = entry[0].backwards.values()
out, lse = entry[0](q, k, v)
def alone():
    return fb(g, q, k, v, out, lse)
for _ in range(3):
    print(f"replay alone (main thread)    {host_us(alone, reps=60):6.1f} us")
    res = {}
    def th():
        res["us"] = host_us(alone, reps=60)
    t = threading.Thread(target=th); t.start(); t.join()
    print(f"replay alone (another thread) {res['us']:6.1f} us")
    print(f"fwd+bwd ours {host_us(lambda: torch.autograd.grad(fwd_ours(), (qg, kg, vg), g), reps=60):6.1f}  sdpa "
          f"{host_us(lambda: torch.autograd.grad(fwd_sdpa(), (qg, kg, vg), g), reps=60):6.1f}  ident "
          f"{host_us(lambda: torch.autograd.grad(fwd_id()[0], (qg, kg, vg), g), reps=60):6.1f} us")
# profile the backward body inside the engine thread
pr = cProfile.Profile()
def bwd_prof(ctx, dout, dlse):
    pr.enable()
    try:
        return real_bwd(ctx, dout, dlse)
    finally:
        pr.disable()
FE.backward = staticmethod(bwd_prof)
for _ in range(2000):
    torch.autograd.grad(fwd_ours(), (qg, kg, vg), g)
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print("\n".join(l[:170] for l in s.getvalue().splitlines()[4:40]))
pr2 = cProfile.Profile()
pr2.enable()
for _ in range(2000):
    alone()
pr2.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr2, stream=s).sort_stats("tottime").print_stats(25)
print("ALONE\n" + "\n".join(l[:170] for l in s.getvalue().splitlines()[4:40]))
