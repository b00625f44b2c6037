"""PNG plots of benchmark rows (matplotlib, headless). Rows are the JSONL dicts the benches write."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_jsonl(path, rows: list[dict]) -> None:
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def add_output_args(parser, plot_help: str) -> None:
    """The benches' shared options: --out (JSONL), --plot (PNG), --from-jsonl (replay without a GPU)."""
    parser.add_argument("--out", default=None, help="append JSONL rows here")
    parser.add_argument("--plot", default=None, help=plot_help)
    parser.add_argument("--from-jsonl", default=None, help="re-plot / re-tabulate saved rows instead of measuring")


def replay_or_require_gpu(args, name: str, plot_fn, table_fn) -> int | None:
    """Before a bench measures: with --from-jsonl, re-plot (if asked) and re-tabulate the saved rows and
    return 0 (no GPU needed); without a GPU, say so and return 2; else None (go on and measure)."""
    if args.from_jsonl:
        rows = read_jsonl(args.from_jsonl)
        if args.plot:
            plot_fn(rows, args.plot)
        print(table_fn(rows))
        return 0
    if not torch.cuda.is_available():
        print(f"{name} needs a CUDA GPU", file=sys.stderr)
        return 2
    return None


def _figure(n_panels: int, cols: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, -(-n_panels // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.7 * rows), squeeze=False)
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat)


def _provenance_line(rows: list[dict]) -> str:
    r = rows[0]
    return f"{r.get('gpu')} | torch {r.get('torch')} | triton {r.get('triton')} | diyflash {r.get('diyflash')}"


# every provider a color of its own: one left to matplotlib's cycle would take its first color, diyflash's
COLORS = {"diyflash": "tab:blue", "sdpa-flash": "tab:green", "sdpa-cudnn": "tab:orange", "flex": "tab:purple",
          "tutorial": "tab:red"}


def plot_attention(rows: list[dict], path) -> None:
    """TFLOPS vs sequence length per provider; one panel per (B, H, D, dtype, causal, pass)."""
    panels: dict = {}
    for r in rows:
        key = (r["b"], r["h"], r["d"], r["dtype"], r["causal"], r["mode"])
        panels.setdefault(key, {}).setdefault(r["provider"], []).append((r["n"], r["tflops"]))
    keys = sorted(panels, key=lambda k: (k[2], k[0], k[1], k[3], k[4], k[5] != "fwd"))
    plt, fig, axes = _figure(len(keys), 4)
    handles: dict = {}  # one legend entry per provider, from whichever panel has it (the tutorial: fp16 only)
    for ax, key in zip(axes, keys):
        b, h, d, dt, causal, mode = key
        for provider, pts in sorted(panels[key].items()):
            pts.sort()
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=COLORS.get(provider),
                            lw=2.2 if provider == "diyflash" else 1.2, label=provider)
            handles.setdefault(provider, line)
        ax.set_xscale("log", base=2)
        ax.set_title(f"B{b} H{h} D{d} {dt} {'causal' if causal else 'full'} {mode}", fontsize=8)
        ax.set_xlabel("sequence length", fontsize=7)
        ax.set_ylabel("TFLOPS", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    if keys:
        axes[0].legend(list(handles.values()), list(handles), fontsize=6)
        fig.suptitle(f"attention: {_provenance_line(rows)}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_matmul(rows: list[dict], path) -> None:
    """diyflash / cuBLAS TFLOPS ratio per shape; one panel per dtype."""
    by_dtype: dict = {}
    for r in rows:
        if r.get("kind") == "ablation":
            continue
        by_dtype.setdefault(r["dtype"], {}).setdefault((r["m"], r["k"], r["n"]), {})[r["provider"]] = r["tflops"]
    plt, fig, axes = _figure(len(by_dtype), 2)
    for ax, (dt, shapes) in zip(axes, sorted(by_dtype.items())):
        keys = [k for k in shapes if {"diyflash", "cublas"} <= set(shapes[k])]
        ratios = [shapes[k]["diyflash"] / shapes[k]["cublas"] for k in keys]
        ax.bar(range(len(keys)), ratios, color=["tab:blue" if x >= 0.9 else "tab:orange" for x in ratios])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.9, color="gray", lw=0.8, ls="--")
        ax.set_xticks(range(len(keys)), [f"{m}x{k}x{n}" for m, k, n in keys], rotation=90, fontsize=5)
        ax.set_ylabel("diyflash / cuBLAS", fontsize=7)
        ax.set_title(f"matmul {dt}", fontsize=8)
        ax.tick_params(labelsize=6)
    if by_dtype:
        fig.suptitle(f"matmul: {_provenance_line(rows)}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
