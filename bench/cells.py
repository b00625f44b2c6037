"""The headline cells against cuDNN: forward and backward of eight attention cells (GQA 32/8, the Llama-3 shape's GQA
64/8 and MHA, head_dim 64 and 128, causal and not, and a causal sliding window against FlexAttention), every
provider timed right after cuDNN.

    python -m bench.cells [--cells NAME ...] [--modes fwd bwd] [--run LABEL] [--out F.jsonl]
    python -m bench.cells --from-jsonl F.jsonl        (the table again, no GPU needed)

Providers: cuDNN and FlashAttention-2 through SDPA, diyflash through its API (`flash_attention`), and in the
backward diyflash with `deterministic=True` too; on the window cell, which SDPA cannot express,
FlexAttention (torch.compile'd, a block mask) is the peer. TFLOPS: forward 4·B·H·N²·D (halved when causal; the
window's visible pairs there), backward 2.5x the forward's, timed alone (autograd.grad of a retained graph).
The providers and their timing are bench.attention's (prepare, measure_cell: five rounds of 50 ms, each
provider right after cuDNN, as a provider timed right after a slower one meets higher clocks on the H200, the
others' order reversed every other round; medians of all samples). A row per (cell, mode, provider): TFLOPS and
the ratio to the cell's peer (cuDNN, or Flex on the window); the default backward's row also has dq's largest
change between two calls (`dq_spread`: its dq is added up in any order). docs/api.md's determinism table renders
such rows (bench/docs.py).
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.attention import inputs, measure_cell, prepare, sdpa
from bench.common import DTYPES, attention_flops, compiled_flex, provenance
from bench.plots import add_output_args, replay_or_require_gpu, write_jsonl

# name: (B, H, H_kv, N, D, causal, dtype name, left window or None)
CELLS = {
    "GQA32/8 D128 causal bf16 B4 N4096": (4, 32, 8, 4096, 128, True, "bf16", None),
    "GQA32/8 D128 causal bf16 B1 N16384": (1, 32, 8, 16384, 128, True, "bf16", None),
    "GQA64/8 D128 causal bf16 B1 N16384": (1, 64, 8, 16384, 128, True, "bf16", None),
    "MHA D64 full fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, False, "fp16", None),
    "MHA D64 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 64, True, "fp16", None),
    "MHA D128 full fp16 B2 H16 N8192": (2, 16, 16, 8192, 128, False, "fp16", None),
    "MHA D128 causal fp16 B2 H16 N8192": (2, 16, 16, 8192, 128, True, "fp16", None),
    "window4096 GQA32/8 D128 causal bf16 B1 N16384": (1, 32, 8, 16384, 128, True, "bf16", 4096),
}
ANCHOR = "cudnn"  # timed right before every other provider; the peer of every cell but the window's


def cell_flops(name: str, mode: str) -> float:
    """The cell's FLOPs: attention_flops, or for the causal window 4·B·H·D times its visible (query, key) pairs,
    N·(w + 1) - w·(w + 1)/2; the backward 2.5x."""
    b, h, _, n, d, causal, _, window = CELLS[name]
    if window is None:
        return attention_flops(b, h, n, n, d, causal, mode)
    pairs = n * (window + 1) - window * (window + 1) / 2
    return (2.5 if mode == "bwd" else 1.0) * 4 * b * h * d * pairs


def providers(name: str) -> tuple[dict, str]:
    """The cell's providers, (q, k, v, causal) -> out as bench.attention's, and its peer: cuDNN and FA2 through
    SDPA, or on the window FlexAttention with the window's block mask (cuDNN, running the plain causal
    attention there, stays the anchor only); diyflash, and diyflash-det (deterministic=True, the backward's)."""
    import diyflash
    from torch.nn.attention import SDPBackend

    n, window = CELLS[name][3], CELLS[name][7]
    window_size = (-1, -1) if window is None else (window, 0)
    found = {ANCHOR: sdpa(SDPBackend.CUDNN_ATTENTION)}
    if window is None:
        found["fa2"] = sdpa(SDPBackend.FLASH_ATTENTION)
    else:
        from torch.nn.attention.flex_attention import create_block_mask

        flex = compiled_flex()
        mask = create_block_mask(lambda bi, hi, qi, ki: (qi >= ki) & (qi - ki <= window), None, None, n, n,
                                 device="cuda")
        found["flex"] = lambda q, k, v, causal: flex(q, k, v, block_mask=mask, enable_gqa=True)
    for provider, deterministic in (("diyflash", False), ("diyflash-det", True)):
        found[provider] = (lambda q, k, v, causal, deterministic=deterministic:
                           diyflash.flash_attention(q, k, v, causal=causal, window_size=window_size,
                                                    deterministic=deterministic))
    return found, ANCHOR if window is None else "flex"


def measure(name: str, modes: list[str]) -> list[dict]:
    """One cell's rows (without provenance): each mode's providers timed in turns, each right after cuDNN
    (bench.attention.measure_cell, its rounds), and the default backward's dq spread between two calls."""
    b, h, h_kv, n, d, causal, dname, _ = CELLS[name]
    q, k, v = inputs(b, h, h_kv, n, d, DTYPES[dname], "bhnd")
    found, peer = providers(name)
    rows = []
    for mode in modes:
        these = {p: fn for p, fn in found.items() if mode == "bwd" or p != "diyflash-det"}
        times = measure_cell(these, q, k, v, causal, mode, anchor=ANCHOR)
        tflops = {p: cell_flops(name, mode) / t[0] / 1e9 for p, t in times.items()}
        spread = None
        if mode == "bwd":
            grads = prepare(found["diyflash"], q, k, v, causal, "bwd")
            spread = (grads()[0].float() - grads()[0].float()).abs().max().item()
        for p, tf in tflops.items():
            if p == ANCHOR and peer != ANCHOR:
                continue  # the window's anchor ran the plain causal attention: not a peer of this cell
            row = dict(cell=name, mode=mode, provider=p, tflops=tf, vs_peer=tf / tflops[peer], peer=peer,
                       peer_tflops=tflops[peer], anchor=ANCHOR if ANCHOR in times else None)
            if p == "diyflash" and spread is not None:
                row["dq_spread"] = spread
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """A line per cell: each mode's TFLOPS of the peer, FA2 and diyflash, diyflash's ratio to the peer, and the
    deterministic backward's TFLOPS and its ratio to the default's."""
    by = {}
    for r in rows:
        by.setdefault(r["cell"], {})[(r["mode"], r["provider"])] = r
    out = ["| cell | fwd cuDNN (Flex) | fwd FA2 | fwd diyflash | fwd ratio | bwd cuDNN (Flex) | bwd FA2 | bwd diyflash "
           "| bwd ratio | bwd deterministic | det. / default |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]

    def tf(cell, mode, provider, paren=False):
        r = cell.get((mode, provider))
        return "-" if r is None else f"({r['tflops']:.0f})" if paren else f"{r['tflops']:.0f}"

    for name, cell in by.items():
        parts = []
        for mode in ("fwd", "bwd"):
            mine = cell.get((mode, "diyflash"))
            flex = (mode, "flex") in cell
            parts += [tf(cell, mode, "flex", True) if flex else tf(cell, mode, "cudnn"), tf(cell, mode, "fa2"),
                      tf(cell, mode, "diyflash"), f"{mine['vs_peer']:.3f}x" if mine else "-"]
        det, mine = cell.get(("bwd", "diyflash-det")), cell.get(("bwd", "diyflash"))
        parts += [tf(cell, "bwd", "diyflash-det"), f"{det['tflops'] / mine['tflops']:.2f}x" if det and mine else "-"]
        out.append(f"| {name} | " + " | ".join(parts) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS), metavar="NAME")
    parser.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    parser.add_argument("--run", default="bench.cells", help="the rows' run label")
    add_output_args(parser, "(no plot: bench.cells writes a table)")
    args = parser.parse_args(argv)
    early = replay_or_require_gpu(args, "bench.cells", lambda rows, path: None, table)
    if early is not None:
        return early
    prov = provenance()
    print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']} | diyflash {prov['diyflash']}")
    rows = []
    for name in args.cells:
        cell_rows = [dict(prov, run=args.run, **r) for r in measure(name, args.modes)]
        print(table(cell_rows).splitlines()[-1], flush=True)
        rows += cell_rows
        torch.cuda.empty_cache()
    if args.out:
        write_jsonl(args.out, rows)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
