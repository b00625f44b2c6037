"""Offline probe (no GPU): capture the portable attention kernels' launches as an H200 would make them (the tuned
tiles; kernels.attention.launch with launch_chunks captured), build each for sm_90a with this Triton and print
ptxas -v's report: wgmma serialization (C7511/C7512/C7514), registers, spills. Run with Triton 3.6 (the GPU
machine's): PYTHONPATH=$PWD python bench/probes/ptxas_probe.py"""
import os, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import torch, triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type
from diyflash.kernels.attention import launch as ka

captured = []
ka.INTERPRETED = False
from diyflash.kernels.attention import plans as kp
def _capture(chunks, key, tma, descs=(), scratch=(), *, plans):
    captured.extend([(kp._with_descriptors(env, descs) if descs else env, launches) for env, launches in chunks])
ka.launch_chunks = _capture
ka.hopper.tiles = lambda *a, **k: None  # the portable forward

def spec(x):
    if isinstance(x, torch.Tensor):
        return "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}[x.dtype]
    if x is None:
        return "constexpr"
    if hasattr(x, "block_shape"):
        return mangle_type(x)
    if isinstance(x, bool):
        return "i1"
    if isinstance(x, int):
        return "i32" if abs(x) < 2**31 else "i64"
    if isinstance(x, float):
        return "fp32"
    raise TypeError(type(x))

def compile_launch(env, lc):
    fn = lc.launcher.kernel
    ptrs = [env.get(n) for n in lc.pointers]
    values = [*ptrs, *lc.args]
    meta = dict(lc.meta)
    opts = {k: meta.pop(k) for k in ("num_warps", "num_stages") if k in meta}
    names = fn.arg_names
    sig, consts = {}, {}
    for n, v in zip(names, values):
        sig[n] = spec(v)
        if v is None:
            consts[(names.index(n),)] = None
    for n, v in meta.items():
        sig[n] = "constexpr"
        consts[(names.index(n),)] = v
    # divisibility by 16 as Triton would specialize: pointers from the allocator and ints divisible by 16
    attrs = {}
    for i, (n, v) in enumerate(zip(names, values)):
        if isinstance(v, torch.Tensor) or (type(v) is int and not isinstance(v, bool) and v % 16 == 0 and v != 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, consts, attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/k.ptx", "w").write(k.asm["ptx"])
        info = subprocess.run([knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"],
                              capture_output=True, text=True).stderr
    ser = [l.split("(C75")[1][:2] for l in info.splitlines() if "serialized" in l]
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/k.cubin", "wb").write(k.asm["cubin"])
        ru = subprocess.run([os.path.join(os.path.dirname(knobs.nvidia.ptxas.path), "cuobjdump"), "--dump-resource-usage", f"{tmp}/k.cubin"], capture_output=True, text=True).stdout
        ru = [l.strip() for l in ru.splitlines() if "REG:" in l]
        print("   triton's cubin:", ru[0][:80] if ru else "?")
    spill = [l.strip() for l in info.splitlines() if "spill" in l]
    print(f"  {fn.__name__:24s} {opts} {'SERIALIZED C75' + ','.join(ser) if ser else 'ok'} | {spill[0] if spill else ''} | wgmma {k.asm['ptx'].count('wgmma.mma_async')}", flush=True)

for d, causal, dtype in [(128, True, torch.bfloat16), (128, False, torch.float16), (64, True, torch.bfloat16), (64, False, torch.float16)]:
    z, h, hk, n = 2, 8, 2, 4096
    q = torch.randn(z, h, n, d, dtype=dtype); k = torch.randn(z, hk, n, d, dtype=dtype); v = torch.randn_like(k)
    out = torch.randn_like(q); lse = torch.randn(z, h, n); dout = torch.randn_like(q)
    for what in ("fwd", "bwd"):
        captured.clear()
        if what == "fwd":
            ka.attention_fwd(q, k, v, causal, d ** -0.5, None)
        else:
            ka.attention_bwd(dout, None, q, k, v, out, lse, causal, d ** -0.5, None)
        print(f"D{d} causal={causal} {str(dtype)[6:]} {what}:", flush=True)
        for env, launches in captured:
            for lc in launches:
                try:
                    compile_launch(env, lc)
                except Exception as e:
                    print("  FAILED", lc.launcher.kernel.__name__, type(e).__name__, str(e)[:300])
