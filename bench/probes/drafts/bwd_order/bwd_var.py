"""Probe: the Hopper backward with its dq and dk matmuls in other orders, beside cuDNN in one process.

.probe/var/bwd_base.py is diyflash/kernels/attention/backward_sm90.py of commit 2cffef2 with its relative
import of .semantics made absolute; bwd_a/b/c.py are it with this folder's diffs applied (patch). a: dq issued
behind dk without draining dv and dk first; b: dq issued before dk, dk left running into the next step (its
q stage released there); c: b without draining dv either. Each variant beside cuDNN in its own interleaved
turns (the backward's plan is one per key)."""
import importlib.util, json, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
from diyflash.kernels.attention import hopper
from bench.common import interleaved_times, quantiles, attention_flops, provenance

OUT = os.environ.get("OUT", "/tmp")
CELLS = [
    ("GQA32/8 D128 causal bf16 B4 N4096", 4, 32, 8, 4096, 128, True, torch.bfloat16),
    ("GQA32/8 D128 causal bf16 B1 N16384", 1, 32, 8, 16384, 128, True, torch.bfloat16),
    ("MHA D128 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, False, torch.float16),
    ("MHA D128 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 128, True, torch.float16),
    ("MHA D64 full fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, False, torch.float16),
    ("MHA D64 causal fp16 B2 H16 N8192", 2, 16, 16, 8192, 64, True, torch.float16),
    ("GQA32/8 D64 causal bf16 B4 N4096", 4, 32, 8, 4096, 64, True, torch.bfloat16),
]
VARS = {128: ["bwd_base", "bwd_b"], 64: ["bwd_base", "bwd_b", "bwd_a", "bwd_c"]}
mods = {}
for name in ("bwd_base", "bwd_a", "bwd_b", "bwd_c"):
    spec = importlib.util.spec_from_file_location(name, f".probe/var/{name}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); mods[name] = m

def use(name):
    hopper.backward_module = lambda m=mods[name]: m
    hopper.LAUNCHERS.pop("_hopper_bwd_kernel", None)
    diyflash.clear_caches()

rows = []
prov = provenance()
print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']}", flush=True)
for cname, B, H, Hk, N, D, causal, dtype in CELLS:
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=dtype, generator=g)
    q, k, v, dout = mk(H).requires_grad_(), mk(Hk).requires_grad_(), mk(Hk).requires_grad_(), mk(H)
    def grad(o):
        return lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)
    flops = attention_flops(B, H, N, N, D, causal, "bwd")
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        fns = {"cudnn": grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != Hk))}
    ref = torch.autograd.grad(diyflash.flash_attention(q, k, v, causal=causal, deterministic=True), (q, k, v), dout)
    errs, res = {}, {}
    for vname in VARS[D]:
        use(vname)
        f = grad(diyflash.flash_attention(q, k, v, causal=causal, deterministic=False))
        try:
            got = f(); torch.cuda.synchronize()
        except Exception as e:
            print(cname, vname, "FAILED", str(e)[:200], flush=True); continue
        errs[vname] = max((x.float() - y.float()).abs().max().item() for x, y in zip(got, ref))
        # one variant at a time beside cuDNN (the backward's plan is one per key: bound to this variant now)
        times = interleaved_times({"cudnn": fns["cudnn"], vname: f}, rounds=5, round_ms=50)
        t = {n: flops / quantiles(x, (0.5,))[0] / 1e9 for n, x in times.items()}
        res[vname] = dict(tflops=t[vname], cudnn=t["cudnn"], ratio=t[vname] / t["cudnn"])
        print(f"  {cname} {vname}: {t[vname]:.0f} vs cudnn {t['cudnn']:.0f} ({res[vname]['ratio']:.3f}x) err {errs[vname]:.2g}", flush=True)
    print(f"{cname}: " + "  ".join(f"{n} {r['ratio']:.3f}x" for n, r in res.items()), flush=True)
    rows.append(dict(prov, cell=cname, variants=res, maxdiff_vs_deterministic=errs))
    json.dump(rows, open(os.path.join(OUT, "bwd_var.json"), "w"), indent=1, default=str)
    del q, k, v, dout, fns
    torch.cuda.empty_cache()
