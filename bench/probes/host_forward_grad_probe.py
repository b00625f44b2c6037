"""Why the forward with grad costs ~48 us more than without, and the replayed backward ~58 us more inside
autograd than alone (bench/probes/host_breakdown_probe.py): which thread launches, through which launcher, and the pieces timed."""
import cProfile, io, pstats, statistics, threading
import torch
import diyflash
from bench.overhead import host_us
from diyflash.kernels import _launch
from diyflash.ops import attention_fast
from diyflash.ops.attention import setup_context

q = torch.randn(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16)
qg = q.detach().requires_grad_()
g = torch.randn_like(q)
for _ in range(5):
    torch.autograd.grad(diyflash.flash_attention(qg, qg, qg), qg, g)
    diyflash.flash_attention(q, q, q)
torch.cuda.synchronize()
(entry,) = [e for k, e in attention_fast._FAST.items() if e is not None and k[0] == q.shape]
fast = entry[0]
log = []
real_fire, real_each = _launch._c_fire, _launch._each
def fire(*a, **kw):
    r = real_fire(*a, **kw)
    log.append(("fire", threading.current_thread().name, r))
    return r
def each(*a, **kw):
    log.append(("each", threading.current_thread().name, len(a[0])))
    return real_each(*a, **kw)
_launch._c_fire, _launch._each = fire, each
torch.autograd.grad(diyflash.flash_attention(qg, qg, qg), qg, g)
torch.cuda.synchronize()
_launch._c_fire, _launch._each = real_fire, real_each
print("launch log (fwd+bwd):", log, "main:", threading.current_thread().name)


class Same(torch.autograd.Function):  # _FastEagerAttention's shape without the plan: outputs by new_empty
    @staticmethod
    def forward(ctx, fast, q, k, v, causal, sm_scale, left, right, softcap, deterministic):
        out, lse = q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)
        setup_context(ctx, (q, k, v, causal, sm_scale, None, left, right, softcap, None, None, 0, deterministic),
                      (out, lse))
        ctx.fast = fast
        return out, lse

    @staticmethod
    def backward(ctx, a, b):
        return (None,) * 10


F = attention_fast._FastEagerAttention
fns = dict(
    api_grad=lambda: diyflash.flash_attention(qg, qg, qg),
    api_nograd=lambda: diyflash.flash_attention(q, q, q),
    fast_lse=lambda: fast(q, q, q),
    fast_nolse=lambda: fast(q, q, q, need_lse=False),
    fn_apply=lambda: F.apply(fast, qg, qg, qg, False, None, -1, -1, 0.0, None),
    same_apply=lambda: Same.apply(fast, qg, qg, qg, False, None, -1, -1, 0.0, None),
    fn_apply_nograd_inputs=lambda: F.apply(fast, q, q, q, False, None, -1, -1, 0.0, None),
)
turns = {n: [] for n in fns}
for _ in range(5):
    for n, fn in fns.items():
        turns[n].append(host_us(fn, reps=40))
for n, t in turns.items():
    print(f"{n:<24} {statistics.median(t):7.1f} us")
pr = cProfile.Profile()
pr.enable()
for _ in range(3000):
    diyflash.flash_attention(qg, qg, qg)
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30)
print("\n".join(l[:170] for l in s.getvalue().splitlines()[6:42]))
