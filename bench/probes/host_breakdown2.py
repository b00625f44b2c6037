"""Host per call of forward, forward + backward and grad() alone: diyflash, SDPA and an identity autograd.Function
(B1 H32 N128 D128 bf16, q = k = v), five interleaved turns. A probe: its rows are table "host breakdown 2" of
bench/results/overhead_h200.jsonl."""
import statistics, time, torch, torch.nn.functional as F, diyflash
from diyflash.kernels import _cplan
_cplan.ready()
q = torch.randn(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn_like(q)

class Id(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q); lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse
    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

def host_us(fn, calls=20, reps=60):
    for _ in range(20): fn()
    torch.cuda.synchronize(); times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls): fn()
        times.append((time.perf_counter() - t0) / calls * 1e6); torch.cuda.synchronize()
    return statistics.median(times)

outs = {"ours": diyflash.flash_attention(q, q, q), "sdpa": F.scaled_dot_product_attention(q, q, q), "id": Id.apply(q, q, q)[0]}
def nograd(f):
    def c():
        with torch.no_grad(): return f()
    return c
cells = {
    "sdpa fwd+bwd": lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, q, q), q, g),
    "ours fwd+bwd": lambda: torch.autograd.grad(diyflash.flash_attention(q, q, q), q, g),
    "identity Function fwd+bwd": lambda: torch.autograd.grad(Id.apply(q, q, q)[0], q, g),
    "sdpa fwd (autograd)": lambda: F.scaled_dot_product_attention(q, q, q),
    "ours fwd (autograd)": lambda: diyflash.flash_attention(q, q, q),
    "identity Function fwd": lambda: Id.apply(q, q, q),
    "sdpa fwd no grad": nograd(lambda: F.scaled_dot_product_attention(q, q, q)),
    "ours fwd no grad": nograd(lambda: diyflash.flash_attention(q, q, q)),
    "sdpa grad() alone": lambda: torch.autograd.grad(outs["sdpa"], q, g, retain_graph=True),
    "ours grad() alone": lambda: torch.autograd.grad(outs["ours"], q, g, retain_graph=True),
    "identity grad() alone": lambda: torch.autograd.grad(outs["id"], q, g, retain_graph=True),
}
turns = {k: [] for k in cells}
for _ in range(5):
    for k, f in cells.items():
        turns[k].append(host_us(f))
for k, v in turns.items():
    print(f"  {k:<32} {statistics.median(v):7.1f} us")
