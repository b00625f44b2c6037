# (issue 48) the Hopper backward's barriers a step: "bar" = the explicit barrier after ds's store moved from before dk's
# issue to just before the ds_ready arrive (where the compiler puts one of its own: one BAR.SYNC fewer a step), "bar_empty"
# = that and the q/do slot released after dq's store (its arrive beside dq_full's: two fewer), against the kernel,
# in one process, each right after cuDNN. From the repository root, on the kernel before (git show 8108c8d:...):
#   python bench/probes/drafts/bwd_barriers/sync_ab.py ROUNDS OUT.jsonl [k,bar,bar_empty]
# (each variant is the kernel with its patch here applied, imported as a module beside it)
import importlib, os, statistics, subprocess, sys, torch, triton, diyflash
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from diyflash.kernels.attention import hopper
NAMES = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("k", "bar", "bar_empty")
MODS = {}
HERE, KERNEL = os.path.dirname(os.path.abspath(__file__)), "diyflash/kernels/attention/backward_sm90.py"
for n in NAMES:
    target = f"diyflash/kernels/attention/backward_sm90_{n}.py"
    subprocess.run(["cp", KERNEL, target], check=True)
    if n != "k":
        subprocess.run(["patch", "-s", target, os.path.join(HERE, f"{n}.diff")], check=True)
    MODS[n] = importlib.import_module(f"diyflash.kernels.attention.backward_sm90_{n}")
CELLS = {"GQA32/8 D128 causal bf16 B4 N4096": (4, 32, 8, 4096, 128, True, torch.bfloat16),
         "GQA32/8 D128 causal bf16 B1 N16384": (1, 32, 8, 16384, 128, True, torch.bfloat16),
         "GQA64/8 D128 causal bf16 B1 N16384": (1, 64, 8, 16384, 128, True, torch.bfloat16),
         "MHA D64 full fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, False, torch.float16),
         "MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, True, torch.float16),
         "MHA D128 full fp16 B2 H16 N8192": (2, 16, 16, 8192, 128, False, torch.float16),
         "MHA D128 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 128, True, torch.float16)}
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
def use(name):
    hopper.backward_module = lambda: MODS[name]
    hopper.LAUNCHERS.pop("_hopper_bwd_kernel", None)
    diyflash.clear_caches()
    hopper.LAUNCHERS.pop("_hopper_bwd_kernel", None)
def make(b, h, hk, n, d, causal, dt):
    torch.manual_seed(0)
    mk = lambda hh: torch.randn(b, hh, n, d, device="cuda", dtype=dt, requires_grad=True)
    return mk(h), mk(hk), mk(hk)
def fn(cell, sdpa=False):
    b, h, hk, n, d, causal, dt = CELLS[cell]
    q, k, v = make(*CELLS[cell])
    if sdpa:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    else:
        out = diyflash.flash_attention(q, k, v, causal=causal)
    do = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
def tf(cell, ms):
    b, h, hk, n, d, causal, dt = CELLS[cell]
    return 2.5 * 4 * b * h * n * n * d / (2 if causal else 1) / ms / 1e9
# the variants on odd shapes: dk and dv bitwise equal to the kernel's, dq within its adds' order
torch.manual_seed(1)
for d, dt, causal in ((128, torch.bfloat16, True), (64, torch.float16, True), (128, torch.float16, False)):
    x = [torch.randn(2, 4, 1000, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3)]
    g = torch.randn(2, 4, 1000, d, device="cuda", dtype=dt)
    gr = {}
    for name in NAMES:
        use(name)
        o = diyflash.flash_attention(*x, causal=causal, deterministic=False)
        gr[name] = torch.autograd.grad(o, x, g)
    for name in NAMES[1:]:
        a, b = gr["k"], gr[name]
        print(f"D{d} causal={causal} {name}: dq max rel diff",
              round(((a[0].float() - b[0].float()).abs().max() / a[0].float().abs().max()).item(), 7),
              "dk equal", torch.equal(a[1], b[1]), "dv equal", torch.equal(a[2], b[2]), flush=True)
def table():
    print("| cell | cuDNN | " + " | ".join(NAMES) + " | " + " | ".join(f"{n} / k" for n in NAMES[1:]) + " |")
    print("|---" * (2 + 2 * len(NAMES) - 1) + "|")
    for cell in CELLS:
        med = {p: statistics.median(res[(cell, p)]) for p in ("cudnn", *NAMES)}
        print(f"| {cell} | {med['cudnn']:.1f} | " + " | ".join(f"{med[n]:.1f} ({med[n]/med['cudnn']:.3f}x)" for n in NAMES)
              + " | " + " | ".join(f"{med[n]/med['k']:.3f}" for n in NAMES[1:]) + " |", flush=True)
res = {(c, p): [] for c in CELLS for p in ("cudnn", *NAMES)}
for rnd in range(ROUNDS):
    for cell in CELLS:
        f_ref = fn(cell, sdpa=True)
        order = NAMES[rnd % len(NAMES):] + NAMES[:rnd % len(NAMES)]
        for p in order:
            res[(cell, "cudnn")].append(tf(cell, triton.testing.do_bench(f_ref, warmup=20, rep=100)))
            use(p)
            f = fn(cell); f(); torch.cuda.synchronize()
            res[(cell, p)].append(tf(cell, triton.testing.do_bench(f, warmup=20, rep=100)))
            del f
        del f_ref; torch.cuda.empty_cache()
    print("round", rnd, "done", flush=True)
    table()
import json
with open(sys.argv[2] if len(sys.argv) > 2 else "/dev/null", "w") as fh:
    for (cell, p), v in res.items():
        fh.write(json.dumps({"cell": cell, "provider": p, "tflops": v}) + "\n")
