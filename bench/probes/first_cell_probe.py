"""What the main job's first validation cell (4.9 s warm) spends: stages timed, and who imports torch._dynamo."""
import builtins, sys, time, traceback
t0 = time.perf_counter()
import torch
stamp = lambda what: print(f"{time.perf_counter() - t0:7.3f}s {what}", flush=True)
stamp("import torch")
real = builtins.__import__
seen = set()
def imp(name, *a, **kw):
    if name.startswith(("torch._dynamo", "sympy", "torch._inductor")) and name not in seen and name not in sys.modules:
        seen.add(name)
        print(f"IMPORT {name} at {time.perf_counter() - t0:.3f}s from:")
        traceback.print_stack(limit=12)
    return real(name, *a, **kw)
builtins.__import__ = imp
import diyflash
stamp("import diyflash")
from diyflash.utils.gpu import print_gpu_info
print_gpu_info(); stamp("gpu info")
from diyflash.ops.runtime import attention_backend
print(attention_backend(torch.device("cuda"))); stamp("backend")
from diyflash.precompile import is_precompiled
stamp("precompile module")
gen = torch.Generator(device="cpu").manual_seed(0)
q, k, v = (torch.randn(2, 2, 1024, 64, generator=gen).to("cuda", torch.float16) for _ in range(3))
torch.cuda.synchronize(); stamp("inputs on the GPU (context)")
qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
out = torch.ops.diyflash.attention(qg, kg, vg, causal=False, scale=None, seq_lens=None)
torch.cuda.synchronize(); stamp("op forward")
g = torch.randn_like(out)
torch.autograd.grad(out, (qg, kg, vg), g)
torch.cuda.synchronize(); stamp("op backward")
from diyflash.reference import attention_ref
r = attention_ref(q.double(), k.double(), v.double(), False)
torch.cuda.synchronize(); stamp("float64 reference")
r = attention_ref(q, k, v, False)
torch.cuda.synchronize(); stamp("fp16 reference")
from diyflash.utils.validation import attention_error_reports
def op(q, k, v, causal, scale, seq_lens):
    return torch.ops.diyflash.attention(q, k, v, causal=causal, scale=scale, seq_lens=seq_lens)
attention_error_reports(op, q, k, v, False)
torch.cuda.synchronize(); stamp("whole first cell")
attention_error_reports(op, q, k, v, False)
torch.cuda.synchronize(); stamp("whole first cell again")
