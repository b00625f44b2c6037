"""Probe (decision made, see bench/README.md): the one-pass backward (dq added up with fp32 atomic adds by
the dk/dv kernel) with the tuned and six other dk/dv tiles per cell, against the two-kernel backward,
cuDNN and FA2 through SDPA, in interleaved rounds. python -m bench.bwd_one_pass_probe (writes $OUT/atomic_tiles.jsonl)."""
import sys, torch, triton, json
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from diyflash.kernels.attention import launch as ka
from diyflash.kernels.attention_configs import AttnConfig as C, bwd_config
from bench.common import interleaved_times, quantiles, attention_flops

CELLS = [  # b, h, hkv, n, d, dtype, causal
    (4, 32, 8, 4096, 128, torch.bfloat16, True),
    (2, 16, 16, 8192, 64, torch.float16, False),
    (2, 16, 16, 8192, 128, torch.float16, True),
]
CANDS = {128: [C(64, 128, 8, 3, tma=True), C(64, 128, 8, 2, tma=True), C(64, 128, 8, 3), C(64, 64, 4, 3, tma=True),
               C(32, 128, 8, 3, tma=True), C(64, 128, 8, 3, split=True, tma=True), C(128, 128, 8, 2, tma=True)],
         64: [C(32, 64, 4, 3, rowoff=True, row64=True), C(64, 64, 4, 3), C(64, 128, 8, 3), C(64, 128, 8, 3, tma=True),
              C(128, 128, 8, 2, tma=True), C(64, 64, 4, 3, tma=True), C(32, 128, 4, 3)]}
rows = []
for b, h, hkv, n, d, dt, causal in CELLS:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, n, d, device="cuda", dtype=dt, generator=g)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dt, generator=g) for _ in range(2))
    scale = d ** -0.5
    out, lse = ka.attention_fwd(q, k, v, causal, scale, None)
    dout = torch.randn_like(out)
    cur = bwd_config(d, dt, q.device, causal, False, n)
    ref = ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, deterministic=True)
    fns = {"det": lambda: ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, deterministic=True)}
    for cfg in CANDS[d]:
        fn = lambda cfg=cfg: ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None,
                                              config=cur._replace(dkdv=cfg), one_pass=True)
        try:
            got = fn()
            err = max((a.float() - r.float()).abs().max().item() for a, r in zip(got, ref))
            fns[str(cfg.as_tiles())] = fn
            print(f"  {cfg.as_tiles()} err vs det {err:.3g}", flush=True)
        except Exception as e:
            print(f"  skip {cfg.as_tiles()}: {type(e).__name__}: {str(e)[:150]}", flush=True)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(be):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=h != hkv)
        fns[name] = lambda o=o: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times = interleaved_times(fns, rounds=5, round_ms=50)
    fl = attention_flops(b, h, n, n, d, causal, "bwd")
    med = {k_: quantiles(t, (0.5,))[0] for k_, t in times.items()}
    print(f"== B{b} H{h}/{hkv} N{n} D{d} {dt} causal={causal}  (TFLOPS, ratio to cudnn)")
    for k_, ms in sorted(med.items(), key=lambda kv: kv[1]):
        print(f"  {k_:45s} {fl / ms / 1e9:6.0f}  {med['cudnn'] / ms:.2f}x", flush=True)
        rows.append(dict(cell=[b, h, hkv, n, d, str(dt), causal], provider=k_, ms=ms, tflops=fl / ms / 1e9))
from diyflash.kernels.attention.backward import _attn_bwd_dkdv_kernel as K
for key, (compiled, names) in ka._BWD_DKDV._compiled.items():
    md = compiled.metadata
    try:
        consts = {K.arg_names[i[0]]: v for i, v in compiled.src.constants.items()}
        tag = {n_: consts.get(n_) for n_ in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "DQ_ATOMIC", "DO_DV", "TMA", "EVEN_M")}
    except Exception as e:
        tag = repr(e)[:60]
    print("dkdv", tag, "regs", compiled.n_regs, "spills", compiled.n_spills, "shared", md.shared, "warps",
          md.num_warps, "stages", md.num_stages, flush=True)
import os
with open(os.environ.get("OUT", ".") + "/atomic_tiles.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
