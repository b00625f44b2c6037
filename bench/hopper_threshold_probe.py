"""Per call (tight loop: host and GPU both counted) of short D128 forwards, "auto" (portable below the work
threshold) against "hopper" (the Hopper kernel at every size), and GPU-only (graph replay) of each."""
import json, os, torch
import diyflash
from diyflash.kernels.attention import hopper
from bench.common import per_call_us, graph_ms, provenance
prov = provenance()
rows = []
for b, h, n, causal in ((1, 32, 128, False), (1, 32, 128, True), (1, 32, 512, True), (1, 16, 1024, True),
                        (1, 32, 1024, True), (4, 16, 1024, False)):
    q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16)
    cell = {}
    for backend in ("auto", "hopper"):
        hopper.use(backend)
        fn = lambda: diyflash.flash_attention(q, q, q, causal=causal)
        cell[backend] = (per_call_us(fn), graph_ms(fn, warm_calls=3) * 1e3)
        rows.append(dict(prov, table="hopper_threshold", shape=f"B{b} H{h} N{n} D128 bf16", causal=causal,
                         backend=backend, work=b * h * n * n * 128, per_call_us=cell[backend][0], graph_us=cell[backend][1]))
    hopper.use("auto")
    print(f"B{b} H{h} N{n} causal={causal} work=2^{(b*h*n*n*128).bit_length()-1}: " + " | ".join(
        f"{k} per call {v[0]:.1f} us, GPU {v[1]:.1f} us" for k, v in cell.items()), flush=True)
with open(os.environ.get("OUT", "/tmp") + "/hopper_threshold.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
