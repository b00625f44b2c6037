"""Regenerate the speed tables of docs/performance.md, docs/api.md and docs/integrations.md from bench/results/*.jsonl.

    python -m bench.docs            rewrite the tables in place
    python -m bench.docs --check    exit 1 where a table differs from its results file (tests/test_docs.py)

A table sits between `<!-- table: NAME -->` and `<!-- end table -->`; NAME picks a renderer, a results file
and (optionally) which of its rows, from _renderers. Above each table, one generated line says where and when
its rows were measured.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
DOCS = (DOC, ROOT / "docs" / "api.md", ROOT / "docs" / "integrations.md")
CELLS_RUN = "cells P"  # the run of cells_h200.jsonl (bench.cells) docs/api.md's and performance.md's tables show
CELLS_H100_RUN = "cells K on an H100"  # cells_h100.jsonl's run, and the same cells on the portable kernels alone
HF_RUN = "thirty-fourth stop, 60 training turns"  # the run of hf_model_h200.jsonl docs/integrations.md's table shows


def _renderers() -> dict:
    import bench.attention as attention
    import bench.attention_variants as variants
    import bench.cells as cells
    import bench.coldstart as coldstart
    import bench.decode as decode
    import bench.hf_model as hf_model
    import bench.matmul as matmul

    return {
        "attention": (attention.readme_table, "attention_h200.jsonl"),
        "attention-d128-recheck": (attention.readme_table, "attention_d128_fwd_recheck_h200.jsonl"),
        "attention-gqa-bnhd": (attention.readme_table, "attention_gqa_bnhd_h200.jsonl"),
        "variants": (variants.table, "attention_variants_h100.jsonl"),
        "decode": (decode.table, "decode_h200.jsonl"),
        "matmul": (matmul.readme_table, "matmul_h200.jsonl"),
        "coldstart": (coldstart.readme_table, "coldstart_h200.jsonl"),
        "coldstart-ahead": (coldstart.ahead_table, "coldstart_compile_ahead_h200.jsonl"),
        "attention-sm90": (_sm90_table, "attention_sm90.jsonl"),
        "determinism": (_determinism_table, "cells_h200.jsonl", lambda r: r["run"] == CELLS_RUN and r["mode"] == "bwd"),
        "cells": (cells.table, "cells_h200.jsonl", lambda r: r["run"] == CELLS_RUN),
        "cells-h100": (cells.table, "cells_h100.jsonl", lambda r: r["run"] == CELLS_H100_RUN),
        "cells-h100-portable": (cells.table, "cells_h100.jsonl", lambda r: r["run"] == CELLS_H100_RUN + ", portable kernels"),
        "hf-model": (hf_model.table, "hf_model_h200.jsonl", lambda r: r.get("run") == HF_RUN),
    }


def _sm90_table(rows: list[dict]) -> str:
    """The Hopper forward's rows (one per cell and run): TFLOPS of each provider and its ratio to cuDNN."""
    lines = ["| run | cell | TFLOPS (ratio to cuDNN; on the window, where cuDNN has none, to the portable kernel or the first) |",
             "|---|---|---|"]
    for r in rows:
        tf = r["tflops"]
        base = tf.get("cudnn") or tf.get("portable") or tf.get("triton") or next(iter(tf.values()))
        cells = ", ".join(f"{name} {v:.0f} ({v / base:.2f}x)" for name, v in tf.items())
        lines.append(f"| {r['run']} | {r['cell']} | {cells} |")
    return "\n".join(lines)


def _determinism_table(rows: list[dict]) -> str:
    """The backward's default (not deterministic) against deterministic=True, beside cuDNN (Flex on the window),
    a cell a line (rows of one run: the providers diyflash, diyflash-det, cudnn or flex)."""
    lines = ["| backward cell | default | `deterministic=True` | cuDNN (Flex) | cost of determinism | dq's spread, two calls |",
             "|---|---|---|---|---|---|"]
    cells = {}
    for r in rows:
        cells.setdefault(r["cell"], {})[r["provider"]] = r
    for cell, by in cells.items():
        mine, det = by["diyflash"], by["diyflash-det"]
        peer = f"{by['cudnn']['tflops']:.0f}" if "cudnn" in by else f"({by['flex']['tflops']:.0f})"
        lines.append(f"| {cell} | {mine['tflops']:.0f} | {det['tflops']:.0f} | {peer} | "
                     f"{det['tflops'] / mine['tflops']:.2f}x | "
                     + (f"{mine['dq_spread']:.1e} |" if mine.get("dq_spread") is not None else "- |"))
    return "\n".join(lines)


def provenance(rows: list[dict], path: str) -> str:
    """Where and when the rows were measured: devices, versions, dates (and runs, where the rows name one),
    from the rows themselves."""
    def values(key, alias=None):
        found = {str(r.get(key, r.get(alias))) for r in rows if r.get(key, r.get(alias)) is not None}
        return ", ".join(sorted(found)) or "?"

    dates = sorted({str(r.get("timestamp") or r.get("date", ""))[:10] for r in rows
                    if r.get("timestamp") or r.get("date")})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} .. {dates[-1]}" if dates else "?"
    runs = sorted({r["run"] for r in rows if r.get("run")})
    where = f"`bench/results/{path}`" + (f" (run \"{runs[0]}\")" if len(runs) == 1 else "")
    return (f"*{len(rows)} rows of {where}: {values('gpu', 'device')}, torch {values('torch')}, "
            f"Triton {values('triton')}, {when}.*")


def render(text: str) -> str:
    """text with every marked table regenerated from its results file."""
    from bench.plots import read_jsonl

    renderers = _renderers()

    def one(match: re.Match) -> str:
        name = match.group(1)
        fn, path, *keep = renderers[name]
        rows = read_jsonl(str(ROOT / "bench" / "results" / path))
        if keep:
            rows = [r for r in rows if keep[0](r)]
        return f"<!-- table: {name} -->\n{provenance(rows, path)}\n\n{fn(rows)}\n<!-- end table -->"

    return re.sub(r"<!-- table: (\S+) -->\n.*?<!-- end table -->", one, text, flags=re.S)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = render(text)
        if new != text:
            stale.append(doc)
            if not args.check:
                doc.write_text(new)
    if args.check and stale:
        print(f"{', '.join(map(str, stale))}: tables differ from bench/results; run python -m bench.docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
