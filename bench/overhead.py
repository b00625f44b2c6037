"""Where the time of a short attention call goes: eager per-call cost of each layer, and GPU-only
time (CUDA graph replay) against the eager time. Prints the tables; --out also writes them as JSONL rows
with provenance (table "call": host_us and per_call_us per call; "short": ms and TFLOPS per provider;
"matmul": host_us and per_call_us per call, graph_us per path).

    python -m bench.overhead [--target] [--out F.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from bench.common import attention_flops, graph_ms, per_call_us, provenance
from bench.plots import write_jsonl


def host_us(fn, calls=20, reps=200) -> float:
    """Host cost per call alone: the median over reps of `calls` calls enqueued back to back, timed
    before the GPU could fill its queue (synchronized between reps)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def tma_and_pointer_tiles(cfg) -> dict:
    """The same tiles read through TMA descriptors and through pointers, for the launch-cost rows: ws and
    rowoff (with row64) are dropped where they do not apply (ws needs TMA, rowoff addresses pointer tiles
    only)."""
    from dataclasses import replace

    return {"TMA": replace(cfg, tma=True, rowoff=False, row64=False),
            "pointer": replace(cfg, tma=False, ws=False)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the rows as JSONL")
    parser.add_argument("--target", action="store_true", help="only issue 47's cells (target_rows)")
    args = parser.parse_args()
    if args.target:
        rows = target_rows(dict(provenance(), command="python -m bench.overhead --target"))
        if args.out:
            write_jsonl(args.out, rows)
        return 0
    import triton

    import diyflash
    from diyflash.kernels.attention import launch as ka

    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    prov = provenance()
    out_rows = []
    q = torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16)
    scale = 64 ** -0.5
    rows = {
        "diyflash.flash_attention": lambda: diyflash.flash_attention(q, q, q),
        "torch.ops.diyflash.attention": lambda: torch.ops.diyflash.attention(q, q, q),
        "torch.ops.diyflash.attention_fwd": lambda: torch.ops.diyflash.attention_fwd(q, q, q, False, None, None),
        "kernels.attention.attention_fwd (launcher)": lambda: ka.attention_fwd(q, q, q, False, scale, None),
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, q, q),
    }
    # TMA's host cost: the layout check and Triton's scratch allocation for the device-built descriptors
    from diyflash.kernels.attention_configs import fwd_config

    q128 = torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.float16)
    for name, cfg in tma_and_pointer_tiles(fwd_config(128, q128.dtype, q128.device, False, False, 128)).items():
        rows[f"launcher, D128, {name} tiles"] = (
            lambda cfg=cfg: ka.attention_fwd(q128, q128, q128, False, 128 ** -0.5, None, config=cfg))
    # a training step's attention: forward and backward, autograd included
    qg = q.detach().requires_grad_()
    rows["diyflash.flash_attention fwd+bwd"] = lambda: diyflash.flash_attention(qg, qg, qg).sum().backward()
    rows["F.scaled_dot_product_attention fwd+bwd"] = lambda: F.scaled_dot_product_attention(qg, qg, qg).sum().backward()
    print("eager per-call cost, (1, 1, 128, 64) fp16: host alone | tight loop")
    for name, fn in rows.items():
        host, loop = host_us(fn), per_call_us(fn)
        out_rows.append(dict(prov, table="call", shape="1x1x128x64 fp16", call=name, host_us=host, per_call_us=loop))
        print(f"  {name:<45} {host:7.1f} us | {loop:7.1f} us")
    out_rows += target_rows(prov)

    print("short sequences: eager (do_bench) vs GPU-only (graph replay), fp16")
    for b, h, n, d in ((4, 32, 1024, 64), (4, 16, 1024, 128), (4, 16, 2048, 128)):
        x = [torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3)]
        for causal in (False, True):
            launcher = lambda: ka.attention_fwd(*x, causal, d ** -0.5, None)  # noqa: E731
            api = lambda: diyflash.flash_attention(*x, causal=causal)  # noqa: E731
            sdpa = lambda: F.scaled_dot_product_attention(*x, is_causal=causal)  # noqa: E731
            flops = attention_flops(b, h, n, n, d, causal, "fwd")
            cells = []
            for name, fn in (("api", api), ("launcher", launcher), ("graph", launcher), ("sdpa", sdpa), ("sdpa-graph", sdpa)):
                ms = graph_ms(fn, warm_calls=3) if "graph" in name else triton.testing.do_bench(fn, return_mode="median")
                cells.append(f"{name} {ms * 1e3:6.0f}us {flops / ms / 1e9:4.0f}TF")
                out_rows.append(dict(prov, table="short", shape=f"B{b} H{h} N{n} D{d} fp16", causal=causal,
                                     provider=name, ms=ms, tflops=flops / ms / 1e9))
            print(f"  B{b} H{h} N{n} D{d} causal={causal}: " + " | ".join(cells))
    out_rows += matmul_rows(prov)
    if args.out:
        write_jsonl(args.out, out_rows)
    return 0


def target_rows(prov: dict) -> list[dict]:
    """The host-cost cells of issue 47, each beside SDPA's default backend: a decode step (B1, 8k keys, GQA
    32/8 D128 bf16) with the default arguments (values checked on the device) and with validate=False, and
    flash_attention's forward and forward + backward at B1 H32 N128 D128 bf16; each diyflash call also with
    its bound launches through Triton's launcher instead of the C launcher, and with its plans replayed from
    Python instead of by one C++ call (kernels/_cplan.py). In five interleaved turns."""
    import diyflash

    qd = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(1, 8, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((1,), 8192, dtype=torch.int32, device="cuda")
    q = torch.randn(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16)
    qg = q.detach().requires_grad_()
    g = torch.randn_like(q)
    cells = {
        "decode B1 8k GQA 32/8 D128 bf16": {
            "flash_attention_with_kvcache": lambda: diyflash.flash_attention_with_kvcache(qd, kc, vc, lens),
            "flash_attention_with_kvcache validate=False":
                lambda: diyflash.flash_attention_with_kvcache(qd, kc, vc, lens, validate=False),
            "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(qd, kc, vc, enable_gqa=True)},
        "B1 H32 N128 D128 bf16 fwd": {
            "diyflash.flash_attention": lambda: diyflash.flash_attention(q, q, q),
            "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, q, q)},
        "B1 H32 N128 D128 bf16 fwd+bwd (autograd.grad)": {
            "diyflash.flash_attention": lambda: torch.autograd.grad(diyflash.flash_attention(qg, qg, qg), qg, g),
            "F.scaled_dot_product_attention":
                lambda: torch.autograd.grad(F.scaled_dot_product_attention(qg, qg, qg), qg, g)},
    }
    from diyflash.kernels._launch import use_c_launcher

    def triton_launcher(fn):  # the same call with every bound launch through Triton's launcher
        def call():
            before = use_c_launcher(False)
            try:
                return fn()
            finally:
                use_c_launcher(before)
        return call

    from diyflash.kernels import _cplan

    def python_replay(fn):  # the same call with the plans replayed from Python (no C++ Program)
        def call():
            before = _cplan.use(False)
            try:
                return fn()
            finally:
                _cplan.use(before)
        return call

    _cplan.ready()  # (its build otherwise runs in the background: the turns would meet it half way)
    for shape, calls in cells.items():
        ours = {name: fn for name, fn in calls.items() if not name.startswith("F.")}
        calls.update({f"{name} (Triton's launcher)": triton_launcher(fn) for name, fn in ours.items()})
        calls.update({f"{name} (Python replay)": python_replay(fn) for name, fn in ours.items()})
    out = []
    print("issue 47's cells: host per call (median of 5 turns), and the ratio to SDPA's in the same run")
    for shape, calls in cells.items():
        turns = {name: [] for name in calls}
        for _ in range(5):
            for name, fn in calls.items():
                turns[name].append(host_us(fn, reps=60))
        hosts = {name: statistics.median(times) for name, times in turns.items()}
        sdpa = hosts["F.scaled_dot_product_attention"]
        for name, host in hosts.items():
            out.append(dict(prov, table="target", shape=shape, call=name, host_us=host, vs_sdpa=host / sdpa))
            print(f"  {shape:<45} {name:<45} {host:7.1f} us  {host / sdpa:5.2f}x SDPA")
    return out


def matmul_rows(prov: dict) -> list[dict]:
    import dataclasses

    import diyflash
    from diyflash.kernels import matmul as km

    print("matmul, fp16: eager per call, host alone/tight loop, vs GPU-only (graph replay)")
    out = []
    for s in (1024, 2048):
        a = torch.randn(s, s, device="cuda", dtype=torch.float16)
        b = torch.randn(s, s, device="cuda", dtype=torch.float16)
        diyflash.triton_matmul(a, b)  # tune
        cfg = km.select_config(a, b, False, True)
        tma, ptr = (km.plan(a, b, dataclasses.replace(cfg, use_tma=t)) for t in (True, False))
        rows = {
            "diyflash.triton_matmul": lambda: diyflash.triton_matmul(a, b),
            "torch.ops.diyflash.matmul": lambda: torch.ops.diyflash.matmul(a, b),
            "kernels.matmul.run (tma)": lambda: km.run(a, b, tma),
            "kernels.matmul.run (pointers)": lambda: km.run(a, b, ptr),
            "torch.matmul": lambda: torch.matmul(a, b),
        }
        cells = []
        for name, fn in rows.items():
            host, loop = host_us(fn), per_call_us(fn, 300)
            out.append(dict(prov, table="matmul", shape=f"{s}^3 fp16", call=name, host_us=host, per_call_us=loop))
            cells.append(f"{name} {host:.0f}/{loop:.0f}us")
        for name, key in (("tma", "kernels.matmul.run (tma)"), ("pointers", "kernels.matmul.run (pointers)"),
                          ("cublas", "torch.matmul")):
            us = graph_ms(rows[key], warm_calls=3) * 1e3
            out.append(dict(prov, table="matmul", shape=f"{s}^3 fp16", call=f"graph({name})", graph_us=us,
                            config=str(cfg)))
            cells.append(f"graph({name}) {us:.0f}us")
        print(f"  {s}^3: " + " | ".join(cells) + f" | config {cfg}")
    return out


if __name__ == "__main__":
    sys.exit(main())
