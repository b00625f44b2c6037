"""Attention variants benchmark (issue 24): GQA, sliding windows, softcap, sinks and MLA's D_v != D_qk,
diyflash against SDPA (flash / cuDNN with enable_gqa, or whatever backend runs the shape) and
FlexAttention with the equivalent block mask and score_mod, measured in the same run.

    python -m bench.attention_variants [--cells gqa window softcap sinks mla] [--dtypes fp16 bf16]
                                       [--modes fwd bwd] [--out results.jsonl]

FLOPs count only visible (query, key) pairs: fwd = 2 * pairs * (D_qk + D_v), bwd = 2 * pairs *
(3 D_qk + 2 D_v) (2.5x the forward when D_qk = D_v, as bench.attention). Every provider of a cell is
timed in interleaved rounds (bench.common.interleaved_times); rows give medians.
Peers that cannot express a cell are left out and said so; FlexAttention has no sinks argument, so its
sinks cells run flex with return_lse and fold the sink into its output and lse afterwards (the exact
gpt-oss formula: out * sigmoid(lse - sink)), which costs it two small elementwise passes.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import DTYPES, compiled_flex, interleaved_times, provenance, quantiles
from bench.plots import write_jsonl

ROUNDS, ROUND_MS = 5, 50


def visible_pairs(n_q: int, n_k: int, causal: bool, window: tuple[int, int]) -> int:
    """How many (query, key) pairs the mask lets through (bottom-right alignment)."""
    from diyflash.reference import visible_mask

    return int(visible_mask(n_q, n_k, causal, window).sum())


def flops(cell: dict, mode: str) -> float:
    pairs = visible_pairs(cell["n"], cell["n"], cell["causal"], cell["window"]) * cell["b"] * cell["h"]
    d, dv = cell["d"], cell["dv"]
    return 2.0 * pairs * ((d + dv) if mode == "fwd" else (3 * d + 2 * dv))


# (name, B, H, H_kv, N, D, D_v, causal, window, softcap, sinks)
CELLS = {
    "gqa": [("gqa", 4, 32, 8, 4096, 128, 128, c, (-1, -1), 0.0, False) for c in (True, False)]
    + [("gqa", 1, 32, 8, 16384, 128, 128, c, (-1, -1), 0.0, False) for c in (True, False)]
    + [("mha", 4, 32, 32, 4096, 128, 128, True, (-1, -1), 0.0, False),
       ("mha", 1, 32, 32, 16384, 128, 128, True, (-1, -1), 0.0, False)],
    "window": [("window", 1, 16, 16, 16384, 128, 128, True, (4095, -1), 0.0, False),
               ("dense-causal", 1, 16, 16, 16384, 128, 128, True, (-1, -1), 0.0, False)],
    "softcap": [("gemma2", 1, 16, 8, 8192, 256, 256, True, (4095, -1), 50.0, False)],
    "sinks": [("gpt-oss-window", 1, 64, 8, 8192, 64, 64, True, (127, -1), 0.0, True),
              ("gpt-oss-full", 1, 64, 8, 8192, 64, 64, True, (-1, -1), 0.0, True)],
    "mla": [("mla", 1, 128, 128, 4096, 192, 128, True, (-1, -1), 0.0, False)],
}


def _flex():
    compiled = compiled_flex()
    if compiled is None:
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    masks = {}

    def run(q, k, v, cell, sinks):
        n, (left, _), causal = cell["n"], cell["window"], cell["causal"]
        key = (n, left, causal)
        if key not in masks:
            def mask_mod(b, h, qi, ki):
                ok = qi >= ki if causal else qi >= 0
                return ok & (qi - ki <= left) if left >= 0 else ok
            masks[key] = create_block_mask(mask_mod, None, None, n, n, device=q.device) if causal or left >= 0 else None
        cap = cell["softcap"]
        score_mod = None
        if cap > 0:
            def score_mod(score, b, h, qi, ki):
                return cap * torch.tanh(score / cap)
        gqa = q.shape[1] != k.shape[1]
        if sinks is None:
            return compiled(q, k, v, score_mod=score_mod, block_mask=masks[key], enable_gqa=gqa)
        out, lse = compiled(q, k, v, score_mod=score_mod, block_mask=masks[key], enable_gqa=gqa, return_lse=True)
        # fold the sink in: out * exp(lse) / (exp(lse) + exp(sink)) = out * sigmoid(lse - sink)
        return out * torch.sigmoid(lse - sinks.view(1, -1, 1)).unsqueeze(-1).to(out.dtype)

    return run


def providers(cell: dict) -> dict:
    import diyflash

    window, cap = cell["window"], cell["softcap"]
    out = {
        "diyflash": lambda q, k, v, s: diyflash.flash_attention(q, k, v, cell["causal"], window_size=window,
                                                                softcap=cap, sinks=s),
    }
    plain = window == (-1, -1) and cap == 0 and not cell["sinks"]
    if plain:
        def sdpa(backend):
            def run(q, k, v, s):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=cell["causal"],
                                                          enable_gqa=q.shape[1] != k.shape[1])
            return run

        if cell["d"] == cell["dv"]:
            out["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
            out["sdpa-cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
        else:  # flash needs D_v = D_qk: whatever backend takes the shape
            out["sdpa-efficient"] = sdpa(SDPBackend.EFFICIENT_ATTENTION)
            out["sdpa-cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    flex = _flex()
    if flex is not None:
        out["flex"] = lambda q, k, v, s: flex(q, k, v, cell, s)
    return out


def prepare(fn, q, k, v, sinks, mode):
    if mode == "fwd":
        bench = lambda: fn(q, k, v, sinks)  # noqa: E731
    else:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)] + ([sinks.detach().requires_grad_()] if sinks
                                                                       is not None else [])
        out = fn(*leaves[:3], leaves[3] if sinks is not None else None)
        dout = torch.randn_like(out)
        bench = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
    for _ in range(3):
        bench()
    torch.cuda.synchronize()
    return bench


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=list(DTYPES))
    parser.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    parser.add_argument("--out", default=None, help="write every row as JSON lines")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.attention_variants needs a CUDA GPU", file=sys.stderr)
        return 2
    prov = provenance()
    print(f"# {prov['gpu']} | torch {prov['torch']} | triton {prov['triton']} | diyflash {prov['diyflash']}")
    rows = []
    for group in args.cells:
        for name, b, h, h_kv, n, d, dv, causal, window, cap, with_sinks in CELLS[group]:
            cell = dict(name=name, b=b, h=h, h_kv=h_kv, n=n, d=d, dv=dv, causal=causal, window=window,
                        softcap=cap, sinks=with_sinks)
            for dname in args.dtypes if group != "mla" else ["bf16"]:
                dtype = DTYPES[dname]
                gen = torch.Generator(device="cuda").manual_seed(0)
                q = torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen)
                k = torch.randn(b, h_kv, n, d, device="cuda", dtype=dtype, generator=gen)
                v = torch.randn(b, h_kv, n, dv, device="cuda", dtype=dtype, generator=gen)
                sinks = torch.randn(h, device="cuda", generator=gen) if with_sinks else None
                for mode in args.modes:
                    benches = {}
                    for pname, fn in providers(cell).items():
                        try:
                            benches[pname] = prepare(fn, q, k, v, sinks, mode)
                        except Exception as e:  # a peer that does not run this cell
                            print(f"  {pname} {name} {dname} {mode}: {type(e).__name__}: {str(e)[:120]}")
                    times = interleaved_times(benches, rounds=ROUNDS, round_ms=ROUND_MS)
                    for pname, t in times.items():
                        med = quantiles(t)[0]
                        rows.append(dict(prov, cell=name, provider=pname, b=b, h=h, h_kv=h_kv, n=n, d=d, dv=dv,
                                         causal=causal, window=list(window), softcap=cap, sinks=with_sinks,
                                         dtype=dname, mode=mode, ms=med, tflops=flops(cell, mode) / med / 1e9))
                del q, k, v
                torch.cuda.empty_cache()
    if args.out:
        write_jsonl(args.out, rows)
    print(table(rows))
    return 0


def table(rows) -> str:
    """Markdown: one line per (cell, dtype, pass): TFLOPS of each provider and diyflash's ratios."""
    cells = {}
    for r in rows:
        key = (r["cell"], r["b"], r["h"], r["h_kv"], r["n"], r["d"], r["dv"], r["causal"], tuple(r["window"]),
               r["softcap"], r["sinks"], r["dtype"], r["mode"])
        cells.setdefault(key, {})[r["provider"]] = r["tflops"]
    names = ["diyflash", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex"]
    out = ["| cell | B H/Hkv N D/Dv | causal window softcap sinks | dtype | pass | "
           + " | ".join(names) + " | vs flash | vs cuDNN | vs flex |", "|" + "---|" * (8 + len(names))]
    for key, c in cells.items():
        cell, b, h, h_kv, n, d, dv, causal, window, cap, sinks, dt, mode = key
        mine = c.get("diyflash")

        def ratio(p):
            return f"{mine / c[p]:.2f}x" if mine and c.get(p) else "-"

        out.append(f"| {cell} | {b} {h}/{h_kv} {n} {d}/{dv} | {causal} {window} {cap:g} {sinks} | {dt} | {mode} | "
                   + " | ".join(f"{c[p]:.0f}" if p in c else "-" for p in names)
                   + f" | {ratio('sdpa-flash')} | {ratio('sdpa-cudnn')} | {ratio('flex')} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
