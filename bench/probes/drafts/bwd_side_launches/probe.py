"""The Hopper backward's side launches on the headline cells: each launch's GPU time in one call (torch.profiler),
and the row passes (preprocess, group sum, dq convert) timed alone with other tiles and warps.

    python bench/probes/drafts/bwd_side_launches/probe.py [--out F.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton

from bench.cells import CELLS
from bench.common import DTYPES, attention_flops, provenance


def cell_inputs(name):
    b, h, h_kv, n, d, causal, dt, _ = CELLS[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, x, n, d, device="cuda", dtype=DTYPES[dt], generator=gen) for x in (h, h_kv, h_kv))
    return q, k, v, causal


def breakdown(name, calls=8):
    """Each kernel's median GPU time (us) over `calls` backward calls, and the call's wall time (CUDA events)."""
    from diyflash.kernels.attention import launch as ka

    q, k, v, causal = cell_inputs(name)
    scale = q.shape[-1] ** -0.5
    out, lse = ka.attention_fwd(q, k, v, causal, scale, None)
    dout = torch.randn_like(out)

    def run():
        return ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, deterministic=False)

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for a, b in ev:
        a.record()
        run()
        b.record()
    torch.cuda.synchronize()
    call_us = statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(e.name, []).append(e.time_range.elapsed_us())
    kern = {k_: statistics.median(v_) for k_, v_ in times.items()}
    b_, h, h_kv, n, d, causal, _, _ = CELLS[name]
    return dict(call_us=call_us, kernels=kern, tflops=attention_flops(b_, h, n, n, d, causal, "bwd") / call_us * 1e-6)


def bench_us(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def row_variants(name):
    """The row passes alone at the cell's size: (pass, variant) -> (us, GB/s)."""
    from diyflash.kernels.attention.backward_rows import (_attn_bwd_dq_convert_kernel, _attn_bwd_group_sum_kernel,
                                                          _attn_bwd_preprocess_kernel)
    from diyflash.kernels.attention import hopper
    from diyflash.kernels.attention.grids import head_split

    b, h, h_kv, n, d, causal, dt, _ = CELLS[name]
    dtype = DTYPES[dt]
    o = torch.randn(b, h, n, d, device="cuda", dtype=dtype)
    do = torch.randn_like(o)
    lse = torch.randn(b, h, n, device="cuda")
    rows = hopper.stat_rows(n)
    delta = torch.empty(b, h, rows, device="cuda")
    lse2 = torch.empty_like(delta)
    dq_rows = hopper.bwd_dq_rows(n, False)
    dq_acc = torch.randn(b, h, dq_rows, d, device="cuda")
    dq = torch.empty_like(o)
    res = {}
    pre_bytes = o.numel() * o.element_size() * 2 + lse.numel() * 4 * 3 + dq_acc.numel() * 4
    for bm, warps in ((64, 4), (64, 8), (128, 8), (32, 4), (32, 2)):
        grid = (triton.cdiv(n, bm), h, b)

        def pre(bm=bm, warps=warps, grid=grid):
            _attn_bwd_preprocess_kernel[grid](
                o, do, lse, lse, delta, lse2, dq_acc, *o.stride(), *do.stride(), *lse.stride(), *lse.stride(),
                h, n, rows, dq_rows, 0.1, HEAD_DIM=d, HEAD_DIM_PAD=d, BLOCK_M=bm, HAS_DLSE=False, ZERO_DQ=True,
                HEAD_DIM_Q=d, HEAD_DIM_Q_PAD=d, SHIFTED=True, num_warps=warps)
        t = bench_us(pre)
        res[("preprocess", f"{bm} rows, {warps} warps")] = (t, pre_bytes / t * 1e-3)
    conv_bytes = dq_acc.numel() * 4 + dq.numel() * dq.element_size()
    for warps in (4, 8, 2):
        grid = (triton.cdiv(n, 64), h, b)

        def conv(warps=warps, grid=grid):
            _attn_bwd_dq_convert_kernel[grid](dq_acc, dq, *dq.stride(), h, n, dq_rows, 0.1, 0.1, HEAD_DIM=d,
                                              HEAD_DIM_PAD=d, BLOCK_M=64, FLAT=True, UNPRESCALE=True,
                                              num_warps=warps)
        t = bench_us(conv)
        res[("convert", f"64 rows, {warps} warps")] = (t, conv_bytes / t * 1e-3)
    key_blocks = triton.cdiv(n, hopper.BWD_BLOCK_N)
    parts = head_split(h // h_kv, key_blocks * h_kv * b, b * h * n * n * d, o.device,
                       max_heads=hopper.BWD_GROUP_HEADS if causal and n >= hopper.BWD_GROUP_MIN_ROWS else None)
    if parts > 1:
        dk = torch.empty(b, h_kv, n, d, device="cuda", dtype=dtype)
        dv = torch.empty_like(dk)
        dkp = torch.randn(b, h_kv * parts, n, d, device="cuda")
        dvp = torch.randn_like(dkp)
        sum_bytes = (dkp.numel() * 2) * 4 + dk.numel() * 2 * dk.element_size()
        for bn, warps in ((32, 4), (64, 8), (16, 4), (32, 8), (64, 4)):
            grid = (triton.cdiv(n, bn), h_kv, b)

            def gsum(bn=bn, warps=warps, grid=grid):
                _attn_bwd_group_sum_kernel[grid](dkp, dvp, dk, dv, *dk.stride(), *dv.stride(), h_kv, n, parts,
                                                 HEAD_DIM=d, HEAD_DIM_PAD=d, HEAD_DIM_V=d, HEAD_DIM_V_PAD=d,
                                                 BLOCK_N=bn, num_warps=warps)
            t = bench_us(gsum)
            res[(f"group sum ({parts} parts)", f"{bn} rows, {warps} warps")] = (t, sum_bytes / t * 1e-3)
    src = torch.empty(pre_bytes // 2 // 4, device="cuda")
    dst = torch.empty_like(src)
    t = bench_us(lambda: dst.copy_(src))
    res[("reference", "torch copy_ (same bytes as the preprocess)")] = (t, pre_bytes / t * 1e-3)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--cells", nargs="*", default=[c for c in CELLS if not c.startswith("window")])
    p.add_argument("--no-rows", action="store_true", help="the breakdowns only")
    args = p.parse_args()
    prov = provenance()
    lines = []
    for name in args.cells:
        bd = breakdown(name)
        total = sum(bd["kernels"].values())
        print(f"## {name}: call {bd['call_us']:.0f} us ({bd['tflops']:.0f} TFLOPS), kernels sum {total:.0f} us")
        for kname, us in sorted(bd["kernels"].items(), key=lambda x: -x[1]):
            print(f"   {us:9.1f} us {100 * us / bd['call_us']:5.1f} %  {kname[:70]}")
        lines.append(dict(prov, run="bwd side launches", cell=name, kind="breakdown", call_us=bd["call_us"],
                          kernels_us=bd["kernels"]))
        for (pas, var), (us, gbs) in ({} if args.no_rows else row_variants(name)).items():
            print(f"   {pas:22s} {var:44s} {us:8.1f} us {gbs:7.0f} GB/s")
            lines.append(dict(prov, run="bwd side launches", cell=name, kind="row pass", row_pass=pas, variant=var,
                              us=us, gb_per_s=gbs))
    if args.out:
        with open(args.out, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
