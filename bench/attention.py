"""Attention benchmark: diyflash against SDPA's flash (FlashAttention-2) and cuDNN backends, measured
in the same run.

    python -m bench.attention [--shapes 4x32x64 4x16x128 2x8x256] [--n 1024 2048 ...] [--dtypes fp16 bf16]
                              [--modes fwd bwd] [--causal both] [--out results.jsonl] [--plot a.png]
    python -m bench.attention --short ...     (B = 16, N = 128, 256, 384, 512: host cost matters here)
    python -m bench.attention --from-jsonl results.jsonl --plot a.png     (no GPU needed)

Providers: diyflash (diyflash-det: deterministic=True, timed in the backward only), SDPA's flash (FlashAttention-2) and cuDNN backends, FlexAttention (torch.compile'd,
a causal block mask when causal) where it runs, and the seed's Triton tutorial where its seed file is
present (bench/tutorial.py; fp16, and its backward causal only).

FLOPs (STYLE.md #11): fwd = 4 * B * H * N^2 * D, halved when causal; bwd = 2.5 * fwd (2.0 for the
backward's four matmuls + 0.5 for recomputing q k^T). The backward is timed alone: the forward runs
once, then autograd.grad(out, (q, k, v), dout) is timed with the graph retained. The providers of a
cell are timed in turns, five rounds of triton.testing.do_bench (CUDA events) each, so that clock
drift meets them alike, each right after cuDNN (--anchor: a provider timed right after a slower one meets
higher clocks; the others' order reversed every other round); rows give the median with p20/p80 of all
samples, the anchor, and provenance.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import DTYPES, attention_flops, compiled_flex, interleaved_times, provenance, quantiles
from bench.plots import add_output_args, plot_attention, replay_or_require_gpu, write_jsonl

SHORT_N = [128, 256, 384, 512]
ROUNDS, ROUND_MS = 5, 50  # per provider and cell: 5 interleaved rounds of 50 ms
ANCHOR = "sdpa-cudnn"  # timed right before each other provider (bench.common.interleaved_times)


def sdpa(backend):
    """A provider (q, k, v, causal) -> out: SDPA held to one backend (SDPBackend), GQA where k has fewer heads."""
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])

    return run


def _providers():
    import diyflash

    providers = {
        "diyflash": lambda q, k, v, causal: diyflash.flash_attention(q, k, v, causal=causal),
        # the backward bitwise reproducible (the default adds dq up with atomics); the forward is the same
        "diyflash-det": lambda q, k, v, causal: diyflash.flash_attention(q, k, v, causal=causal, deterministic=True),
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    from bench.tutorial import tutorial_provider

    tutorial = tutorial_provider()  # the seed's Triton tutorial, where its seed file is present
    if tutorial is not None:
        providers["tutorial"] = tutorial
    flex = compiled_flex()
    if flex is None:
        return providers
    from torch.nn.attention.flex_attention import create_block_mask

    masks = {}

    def run_flex(q, k, v, causal):
        mask = None
        if causal:
            n = q.shape[-2]
            if n not in masks:
                masks[n] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=q.device)
            mask = masks[n]
        return flex(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != q.shape[1])

    providers["flex"] = run_flex
    return providers


def prepare(fn, q, k, v, causal, mode):
    """The callable to time: the forward, or the backward alone (autograd.grad of one retained graph).
    It runs three times untimed first: a new kernel specialisation compiles for seconds with the GPU
    idle, and a short warm-up alone then measured the first length of each configuration ~2x slow."""
    if mode == "fwd":
        bench = lambda: fn(q, k, v, causal)  # noqa: E731
    else:
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = fn(qg, kg, vg, causal)
        dout = torch.randn_like(out)
        bench = lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)  # noqa: E731
    for _ in range(3):
        bench()
    torch.cuda.synchronize()
    return bench


def measure_cell(providers: dict, q, k, v, causal, mode, report=print, anchor: str | None = ANCHOR) -> dict:
    """{provider: (median, p20, p80) ms} for one cell, the providers timed in interleaved rounds
    (bench.common.interleaved_times), each right after `anchor` where that provider runs the cell. A provider
    that does not run this cell is reported and left out."""
    benches = {}
    for name, fn in providers.items():
        try:
            benches[name] = prepare(fn, q, k, v, causal, mode)
        except Exception as e:  # a backend that does not run this shape
            report(f"  {name} {tuple(q.shape)} {mode}: {type(e).__name__}: {str(e)[:100]}")
    times = interleaved_times(benches, rounds=ROUNDS, round_ms=ROUND_MS, anchor=anchor if anchor in benches else None)
    return {name: quantiles(t) for name, t in times.items()}


def inputs(b, h, hkv, n, d, dtype, layout):
    """q (B, H, N, D) and k, v (B, Hkv, N, D), random normal; bnhd: views of (B, N, H, D) buffers."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def make(heads):
        if layout == "bnhd":
            return torch.randn(b, n, heads, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
        return torch.randn(b, heads, n, d, device="cuda", dtype=dtype, generator=gen)

    return make(h), make(hkv), make(hkv)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["4x32x64", "4x16x128", "2x8x256"], help="BxHxD")
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--short", action="store_true",
                        help="the short-sequence sweep instead: B=16 with each shape's H and D, N = 128..512")
    parser.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=list(DTYPES))
    parser.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    parser.add_argument("--causal", choices=["both", "true", "false"], default="both")
    parser.add_argument("--providers", nargs="+", default=None)
    parser.add_argument("--anchor", default=ANCHOR,
                        help="the provider timed right before each of the others (none: one fixed order a round)")
    parser.add_argument("--kv-heads", type=int, default=None,
                        help="GQA: this many k/v heads (SDPA with enable_gqa=True); default: H (MHA)")
    parser.add_argument("--layout", choices=["bhnd", "bnhd"], default="bhnd",
                        help="bnhd: q, k, v are (B, H, N, D) views of (B, N, H, D) buffers, as transformers passes them")
    add_output_args(parser, "write a PNG: TFLOPS vs N per provider, a panel per config")
    args = parser.parse_args(argv)
    early = replay_or_require_gpu(args, "bench.attention", plot_attention, readme_table)
    if early is not None:
        return early

    providers = _providers()
    if args.providers:
        providers = {k: providers[k] for k in args.providers}
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    anchor = None if args.anchor == "none" else args.anchor
    prov = provenance()
    print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']} | diyflash {prov['diyflash']}")
    rows = []
    from tqdm import tqdm

    shapes, lengths = args.shapes, args.n
    if args.short:
        shapes = ["16x" + shape.split("x", 1)[1] for shape in args.shapes]
        lengths = SHORT_N
    cells = [(shape, dname, causal, n) for shape in shapes for dname in args.dtypes
             for causal in causals for n in lengths]
    for shape, dname, causal, n in tqdm(cells, desc="attention cells", unit="cell"):
        b, h, d = (int(x) for x in shape.split("x"))
        q, k, v = inputs(b, h, args.kv_heads or h, n, d, DTYPES[dname], args.layout)
        for mode in args.modes:
            these = {name: fn for name, fn in providers.items() if mode == "bwd" or name != "diyflash-det"}
            times = measure_cell(these, q, k, v, causal, mode, tqdm.write, anchor)
            for name, (med, p20, p80) in times.items():
                tflops = attention_flops(b, h, n, n, d, causal, mode) / med / 1e9
                rows.append(dict(prov, provider=name, b=b, h=h, hkv=args.kv_heads or h, layout=args.layout, d=d,
                                 n=n, dtype=dname, causal=causal, mode=mode, ms=med, p20_ms=p20, p80_ms=p80,
                                 tflops=tflops, anchor=anchor if anchor in times else None))
        del q, k, v
        torch.cuda.empty_cache()
    if args.out:
        write_jsonl(args.out, rows)
    if args.plot:
        plot_attention(rows, args.plot)
    print_table(rows)
    return 0


def print_table(rows) -> None:
    """Markdown table: diyflash TFLOPS and its ratio to each baseline, per cell."""
    cells = {}
    for r in rows:
        key = (r["b"], f'{r["h"]}/{r.get("hkv", r["h"])}', r["d"], r["dtype"], r["causal"], r["mode"], r["n"])
        cells.setdefault(key, {})[r["provider"]] = r["tflops"]
    print("| B H/Hkv D | dtype | causal | pass | N | diyflash | sdpa-flash | sdpa-cudnn | flex | tutorial | vs flash "
          "| vs cudnn | vs tutorial | deterministic | det. vs cudnn |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(cells, key=lambda k: (k[2], k[0], k[1], k[3], k[4], k[5], k[6])):
        b, h, d, dt, causal, mode, n = key
        c = cells[key]
        mine = c.get("diyflash")

        def fmt(x):
            return f"{x:.0f}" if x is not None else "-"

        def ratio(base, of="diyflash"):
            return f"{c[of] / c[base]:.2f}x" if c.get(of) and c.get(base) else "-"

        print(f"| {b} {h} {d} | {dt} | {causal} | {mode} | {n} | {fmt(mine)} | {fmt(c.get('sdpa-flash'))} | "
              f"{fmt(c.get('sdpa-cudnn'))} | {fmt(c.get('flex'))} | {fmt(c.get('tutorial'))} | {ratio('sdpa-flash')} | "
              f"{ratio('sdpa-cudnn')} | {ratio('tutorial')} | {fmt(c.get('diyflash-det'))} | "
              f"{ratio('sdpa-cudnn', 'diyflash-det')} |")


def readme_table(rows) -> str:
    """One line per (shape, dtype, causal, N): forward and backward TFLOPS with ratios to the baselines."""
    cells = {}
    for r in rows:
        key = (r["d"], r["b"], r["h"], r["dtype"], r["causal"], r["n"])
        cells.setdefault(key, {})[(r["mode"], r["provider"])] = r["tflops"]
    out = ["| B H D | dtype | causal | N | fwd diyflash | fwd SDPA-flash / cuDNN | fwd ratio vs flash / cuDNN "
           "| bwd diyflash | bwd SDPA-flash / cuDNN | bwd ratio vs flash / cuDNN |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cells):
        d, b, h, dt, causal, n = key
        c = cells[key]
        parts = []
        for mode in ("fwd", "bwd"):
            mine, fl, cu = (c.get((mode, p)) for p in ("diyflash", "sdpa-flash", "sdpa-cudnn"))
            parts += [f"{mine:.0f}" if mine else "-",
                      f"{fl:.0f} / {cu:.0f}" if fl and cu else "-",
                      f"{mine / fl:.2f}x / {mine / cu:.2f}x" if mine and fl and cu else "-"]
        out.append(f"| {b} {h} {d} | {dt} | {'yes' if causal else 'no'} | {n} | " + " | ".join(parts) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
