"""Matmul benchmark: diyflash.triton_matmul against torch.matmul (cuBLAS), measured in the same run.

    python -m bench.matmul [--dtypes fp16 bf16] [--out results.jsonl] [--ablation] [--plot m.png]
    python -m bench.matmul --from-jsonl results.jsonl --plot m.png      (no GPU needed)

Shapes: squares 1024..8192 and transformer projections (M = tokens 2048..16384, (K, N) in
{(4096, 4096), (4096, 11008), (11008, 4096), (8192, 28672)}). FLOPs = 2*M*N*K. Each problem is run
once untimed first (that call autotunes diyflash for the shape bucket); times are medians of
triton.testing.do_bench with p20/p80. --ablation times fixed configs with and without tensor
descriptors (TMA) and persistent scheduling, to say what each gives.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import torch

from bench.common import DTYPES, graph_ms, provenance
from bench.plots import add_output_args, plot_matmul, replay_or_require_gpu, write_jsonl

SQUARES = [(s, s, s) for s in (1024, 2048, 4096, 8192)]
TRANSFORMER = [(m, k, n) for m in (2048, 4096, 8192, 16384)
               for k, n in ((4096, 4096), (4096, 11008), (11008, 4096), (8192, 28672))]


def timed(fn):
    import triton

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=50, rep=200, quantiles=[0.5, 0.2, 0.8])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=list(DTYPES))
    parser.add_argument("--ablation", action="store_true", help="TMA / persistent on and off, fixed tiles")
    add_output_args(parser, "write a PNG: diyflash / cuBLAS per shape, a panel per dtype")
    args = parser.parse_args(argv)
    early = replay_or_require_gpu(args, "bench.matmul", plot_matmul, readme_table)
    if early is not None:
        return early

    import diyflash
    from diyflash.kernels import matmul as km

    prov = provenance()
    print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']} | diyflash {prov['diyflash']}")
    rows = []
    from tqdm import tqdm

    problems = [(dname, kind, shape) for dname in args.dtypes
                for kind, shapes in (("square", SQUARES), ("transformer", TRANSFORMER)) for shape in shapes]
    for dname, kind, (m, k, n) in tqdm(problems, desc="matmul shapes", unit="shape"):
        dtype = DTYPES[dname]
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
        b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
        flops = 2.0 * m * n * k
        for name, fn in (("diyflash", lambda: diyflash.triton_matmul(a, b)),
                         ("cublas", lambda: torch.matmul(a, b))):
            med, p20, p80 = timed(fn)
            row = dict(prov, provider=name, kind=kind, m=m, k=k, n=n, dtype=dname, ms=med,
                       p20_ms=p20, p80_ms=p80, tflops=flops / med / 1e9)
            if flops <= 2 * 2048**3:  # host-bound sizes: also the GPU-only time (graph replay)
                row["graph_tflops"] = flops / graph_ms(fn, warmup=50, rep=200) / 1e9
            if name == "diyflash":
                row["config"] = km.select_config(a, b, False, True).as_dict()
            rows.append(row)
        if args.ablation and (m, k, n) in ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 11008)):
            best = km.select_config(a, b, False, True)
            for tma in (True, False):
                for persistent in (True, False):
                    cfg = dataclasses.replace(best, use_tma=tma, persistent=persistent)
                    med, p20, p80 = timed(lambda: km.matmul(a, b, cfg))
                    rows.append(dict(prov, provider=f"ablation tma={tma} persistent={persistent}",
                                     kind="ablation", m=m, k=k, n=n, dtype=dname, ms=med, p20_ms=p20,
                                     p80_ms=p80, tflops=flops / med / 1e9, config=cfg.as_dict()))
        del a, b
        torch.cuda.empty_cache()
    if args.out:
        write_jsonl(args.out, rows)
    if args.plot:
        plot_matmul(rows, args.plot)
    print(readme_table(rows))
    return 0


def readme_table(rows) -> str:
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["dtype"], r["kind"], r["m"], r["k"], r["n"]), {})[r["provider"]] = r
    out = ["| dtype | M x K x N | diyflash TFLOPS | cuBLAS TFLOPS | ratio | diyflash tiles |",
           "|---|---|---|---|---|---|"]
    ratios: dict = {}
    for key in sorted(cells, key=lambda k: (k[0], k[1] != "square", k[2], k[3], k[4])):
        dt, kind, m, k, n = key
        c = cells[key]
        if kind == "ablation" or "diyflash" not in c or "cublas" not in c:
            continue
        mine, base = c["diyflash"]["tflops"], c["cublas"]["tflops"]
        ratios.setdefault(dt, []).append(mine / base)
        cfg = c["diyflash"].get("config") or {}
        tiles = (f"{cfg.get('block_m')}x{cfg.get('block_n')}x{cfg.get('block_k')} w{cfg.get('num_warps')} "
                 f"s{cfg.get('num_stages')}{' tma' if cfg.get('use_tma') else ''}{' persistent' if cfg.get('persistent') else ''}")
        graph = ""
        if "graph_tflops" in c["diyflash"] and "graph_tflops" in c["cublas"]:
            g_mine, g_base = c["diyflash"]["graph_tflops"], c["cublas"]["graph_tflops"]
            graph = f" (GPU-only: {g_mine:.0f} vs {g_base:.0f}, {g_mine / g_base:.2f}x)"
        out.append(f"| {dt} | {m} x {k} x {n} | {mine:.0f} | {base:.0f} | {mine / base:.2f}x{graph} | {tiles} |")
    for dt, rs in ratios.items():
        out.append(f"\n{dt}: median ratio {statistics.median(rs):.2f}x, min {min(rs):.2f}x over {len(rs)} shapes")
    abl = [r for r in rows if r["kind"] == "ablation"]
    if abl:
        out.append("\n| dtype | M x K x N | variant (tuned tiles) | TFLOPS |\n|---|---|---|---|")
        for r in abl:
            out.append(f"| {r['dtype']} | {r['m']} x {r['k']} x {r['n']} | {r['provider'][9:]} | {r['tflops']:.0f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
