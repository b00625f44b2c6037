"""One call of cuDNN (through SDPA) and one of diyflash on a headline cell, for Nsight Compute: the two calls'
counters summed over each call's kernels (a spin kernel between them marks where cuDNN's call ends).

    ncu --profile-from-start off --clock-control none --csv --metrics M \
        python bench/probes/drafts/power_clock/ncu_pair.py --cell NAME --mode fwd > F.csv
    python bench/probes/drafts/power_clock/ncu_pair.py --table F.csv --cell NAME --mode fwd
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

sys.path.insert(0, os.getcwd())


def run(cell: str, mode: str) -> None:
    import torch

    from bench.attention import inputs, prepare
    from bench.cells import CELLS, providers
    from bench.common import DTYPES

    b, h, h_kv, n, d, causal, dname, _ = CELLS[cell]
    q, k, v = inputs(b, h, h_kv, n, d, DTYPES[dname], "bhnd")
    found, _ = providers(cell)
    benches = [prepare(found[p], q, k, v, causal, mode) for p in ("cudnn", "diyflash")]
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    benches[0]()
    torch.cuda.synchronize()
    torch.cuda._sleep(1000)  # the marker: kernels after it are diyflash's
    torch.cuda.synchronize()
    benches[1]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def table(path: str, cell: str, mode: str) -> None:
    from bench.cells import cell_flops

    kernels = {}  # id -> (name, {metric: value})
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        kid = int(row["ID"])
        name, metrics = kernels.setdefault(kid, (row["Kernel Name"], {}))
        try:
            metrics[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    ids = sorted(kernels)
    marker = next(i for i in ids if "spin" in kernels[i][0])
    sides = {"cudnn": [i for i in ids if i < marker], "diyflash": [i for i in ids if i > marker]}
    tflop = cell_flops(cell, mode) / 1e12
    sums = {}
    for side, kids in sides.items():
        total = {}
        for i in kids:
            for m, val in kernels[i][1].items():
                if m.endswith(".sum"):
                    total[m] = total.get(m, 0.0) + val
        ns = [kernels[i][1].get("gpu__time_duration.sum", 0.0) for i in kids]
        hz = [kernels[i][1].get("sm__cycles_elapsed.avg.per_second", 0.0) for i in kids]
        total["clock (MHz, time-weighted)"] = sum(a * b for a, b in zip(ns, hz)) / max(sum(ns), 1e-9) / 1e6 * tflop
        sums[side] = total
        print(f"{side}: {len(kids)} kernels: " + ", ".join(kernels[i][0][:60] for i in kids))
    print(f"\n{cell} {mode}, per TFLOP of the cell's work ({tflop:.2f} TFLOP a call)")
    print("| counter | cuDNN | diyflash | ratio |")
    print("|---|---|---|---|")
    for m in sorted(set(sums["cudnn"]) | set(sums["diyflash"])):
        c, o = sums["cudnn"].get(m), sums["diyflash"].get(m)
        if c is None or o is None:
            continue
        print(f"| {m} | {c / tflop:.4g} | {o / tflop:.4g} | {o / c if c else float('nan'):.3f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--cell", required=True)
    parser.add_argument("--mode", default="fwd")
    parser.add_argument("--table", default=None)
    args = parser.parse_args()
    if args.table:
        table(args.table, args.cell, args.mode)
    else:
        run(args.cell, args.mode)
