"""A probe: fwd+bwd and grad() alone host time: the C++ node vs the Python autograd.Function (the old path), SDPA,
B1 H32 N128 D128 bf16, five interleaved turns."""
import statistics, time, torch, torch.nn.functional as F, diyflash
from diyflash.kernels import _cplan
from diyflash.ops import attention_fast as af
print("module", _cplan.ready(), _cplan.reason())
q = torch.randn(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn_like(q)
node_module = af.cplan_node_module
def old(fn):
    def c():
        af.cplan_node_module = lambda b: None
        try: return fn()
        finally: af.cplan_node_module = node_module
    return c
def host_us(fn, calls=20, reps=60):
    for _ in range(20): fn()
    torch.cuda.synchronize(); times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls): fn()
        times.append((time.perf_counter() - t0) / calls * 1e6); torch.cuda.synchronize()
    return statistics.median(times)
fb = lambda: torch.autograd.grad(diyflash.flash_attention(q, q, q), q, g)
for _ in range(3): fb(); old(fb)()
outs = {"node": diyflash.flash_attention(q, q, q), "sdpa": F.scaled_dot_product_attention(q, q, q)}
outs["function"] = old(lambda: diyflash.flash_attention(q, q, q))()
print({k: v.grad_fn.name() for k, v in outs.items()})
cells = {
    "sdpa fwd+bwd": lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, q, q), q, g),
    "node fwd+bwd": fb,
    "function fwd+bwd": old(fb),
    "sdpa fwd": lambda: F.scaled_dot_product_attention(q, q, q),
    "node fwd": lambda: diyflash.flash_attention(q, q, q),
    "function fwd": old(lambda: diyflash.flash_attention(q, q, q)),
    "sdpa grad() alone": lambda: torch.autograd.grad(outs["sdpa"], q, g, retain_graph=True),
    "node grad() alone": lambda: torch.autograd.grad(outs["node"], q, g, retain_graph=True),
    "function grad() alone": lambda: torch.autograd.grad(outs["function"], q, g, retain_graph=True),
}
turns = {k: [] for k in cells}
for _ in range(5):
    for k, f in cells.items():
        turns[k].append(host_us(f))
sd = {}
for k, v in turns.items():
    m = statistics.median(v); sd.setdefault(k.split()[0] == "sdpa" and k[5:] or None, m)
    base = statistics.median(turns["sdpa " + k.split(" ", 1)[1]])
    print(f"  {k:<24} {m:7.1f} us  {m / base:5.2f}x SDPA")
