"""D64 forward: the Hopper kernel with three consumers (and variants) beside cuDNN, FA2 and the portable kernel."""
import json, os, sys, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import diyflash
from diyflash.kernels.attention import hopper
from bench.common import attention_flops, interleaved_times, quantiles, provenance
from bench.attention import _inputs

state = {"v": None}
def ours(backend, tiles=None):
    def run(q, k, v, causal):
        want = (backend, tiles)
        if state["v"] != want:
            hopper._backend = backend
            if tiles is not None:
                hopper.TILES[q.shape[-1]] = tiles
            diyflash.clear_caches()
            state["v"] = want
        return diyflash.flash_attention(q, k, v, causal=causal)
    return run
def sdpa(b):
    def run(q, k, v, causal):
        with sdpa_kernel(b):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return run
T = hopper.Tiles
prov = provenance()
rows = []
cells = [(2, 16, 16, 8192, 64, torch.float16, c) for c in (False, True)] + [
    (4, 32, 8, 4096, 64, torch.bfloat16, True), (16, 16, 16, 1024, 64, torch.float16, False),
    (2, 16, 16, 8192, 128, torch.float16, True), (4, 32, 8, 4096, 128, torch.bfloat16, True)]
for b, h, hkv, n, d, dtype, causal in cells:
    q, k, v = _inputs(b, h, hkv, n, d, dtype, "bhnd")
    prov_ = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "fa2": sdpa(SDPBackend.FLASH_ATTENTION),
             "portable": ours("portable")}
    if d == 64:
        for name, t in (("gl3_s3", T(128, 3, 3)), ("gl3_s2", T(128, 2, 3)), ("gl3_s4", T(128, 4, 3)), ("gl2_s3", T(128, 3, 2))):
            prov_[name] = ours("hopper", t)
    else:
        prov_["gl2_s2"] = ours("hopper", T(128, 2, 2))
    ref = prov_["cudnn"](q, k, v, causal)
    benches = {}
    for name, fn in prov_.items():
        o = fn(q, k, v, causal); torch.cuda.synchronize()
        err = (o.float() - ref.float()).abs().max().item()
        print(f"  check {name}: max|diff vs cudnn| {err:.3g}", flush=True)
        benches[name] = (lambda fn=fn: fn(q, k, v, causal))
    times = interleaved_times(benches, rounds=5, round_ms=50)
    fl = attention_flops(b, h, n, n, d, causal, "fwd")
    med = {nm: quantiles(t)[0] for nm, t in times.items()}
    line = " ".join(f"{nm} {fl / m / 1e9:.0f} ({med['cudnn'] / m:.2f}x)" for nm, m in med.items())
    print(f"B{b} H{h}/{hkv} N{n} D{d} {str(dtype)[6:]} causal={causal}: {line}", flush=True)
    for nm, m in med.items():
        rows.append(dict(prov, table="d64_consumers", shape=f"B{b} H{h}/{hkv} N{n} D{d}", dtype=str(dtype)[6:],
                         causal=causal, provider=nm, ms=m, tflops=fl / m / 1e9, vs_cudnn=med["cudnn"] / m))
with open(os.environ.get("OUT", "/tmp") + "/d64_consumers.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
