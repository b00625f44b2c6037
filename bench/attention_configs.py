"""Re-tune the attention tiles on this GPU and record them: the one command behind attention_tuned.py.

    python -m bench.attention_configs [--n 4096] [--dtype fp16] [--head-dims 64 128 256]
                                      [--causal both] [--kinds fwd dkdv dv dq] [--out rows.jsonl] [--write]
                                      [--bucket] [--confirm 4] [--tma both] [--ws both]

For each kernel (forward, backward dk/dv, the dv pass of a split dk/dv, backward dq), head_dim and
causal setting, every candidate of diyflash/kernels/attention_configs.py that fits shared memory is
run, checked against the current tiles' result, and timed (median of triton.testing.do_bench). A
backward candidate for one kernel is timed as the whole backward with the other kernels' current
tiles, so only its own kernel differs. The dv pass is swept only where dk/dv is split.
The four fastest and the current tiles are then timed again in turns (interleaved rounds, --confirm),
and that second timing picks the winner. --tma and --ws (only/none) restrict the candidates; the
current tiles are always among them.
--write rewrites diyflash/kernels/attention_tuned.py with the winners (entries not swept are kept)
and adds this sweep (device, versions, N, command) to the head of its history; --out keeps every timing.
A winner serves every length, or with --bucket sequences up to N only: the entry becomes
{N: winner, ..., None: the tiles it had}, and a later sweep without --bucket replaces the None tiles.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench.common import DTYPES, attention_flops, interleaved_times, provenance, quantiles

# the kernels in the order a sweep tunes them: the dv pass after dk/dv, whose tiles decide whether the
# backward is split into a dv pass and a dk pass at all
KINDS = ("fwd", "dkdv", "dv", "dq")
SHAPES = {64: (4, 32), 128: (4, 16), 256: (2, 8)}  # (batch, heads) per head_dim: the benchmark's shapes
# do_bench per candidate. 10 ms / 50 ms picked winners that the full benchmark did not confirm;
# with 25 ms / 100 ms the TMA probe's winners held up there.
WARMUP_MS, REP_MS = 25, 100
# The leaders' second timing, in turns (bench.common.interleaved_times): a full-benchmark run did not
# confirm a first-pass winner that led by 9 % (D64 causal forward).
CONFIRM, CONFIRM_ROUNDS, CONFIRM_MS = 4, 6, 60


def _tiles(row: dict) -> tuple:
    """A result row's tiles as attention_tuned.py records them."""
    from diyflash.kernels.attention_configs import AttnConfig

    fields = ("block_m", "block_n", "num_warps", "num_stages", *AttnConfig.FLAGS)
    return AttnConfig(**{f: row[f] for f in fields if f in row}).as_tiles()


def render_tuned(table: dict) -> str:
    """The source of attention_tuned.py for `table` (kind -> "plain"/"causal" -> head_dim -> tiles). The
    sweeps and hand edits behind it are rows of HISTORY, not lines of the source."""
    def entry(tiles) -> str:
        if isinstance(tiles, dict):  # length buckets, None (longer sequences) last
            order = sorted(n for n in tiles if n is not None) + [None]
            return "{" + ", ".join(f"{n!r}: {tuple(tiles[n])}" for n in order) + "}"
        return str(tuple(tiles))

    lines = ["TUNED = {"]
    for kind, modes in table.items():
        lines.append(f"    {kind!r}: {{")
        for mode, dims in modes.items():
            entries = ", ".join(f"{d}: {entry(dims[d])}" for d in sorted(dims))
            lines.append(f"        {mode!r}: {{{entries}}},")
        lines.append("    },")
    lines.append("}")
    return ('"""Tuned attention tiles (block_m, block_n, num_warps, num_stages, *flags) per kernel, causal or not,\n'
            'and padded head_dim. Written by `python -m bench.attention_configs --write`: re-run it rather than edit by hand.\n'
            f'Each sweep that wrote it, and each hand edit, is a row of {HISTORY}\n'
            '(device, versions, date, command or reason); an entry comes from the newest row that covered it."""\n\n'
            + "\n".join(lines) + "\n")


def sweep_one(kind, d, causal, dtype, n, candidates, cost, limit, confirm=CONFIRM, keep=lambda cfg: True):
    """Time every fitting candidate of one kernel (those `keep` keeps, and the current tiles); returns
    result rows (ok = matches the current tiles' result). The `confirm` fastest and the current tiles are then re-timed
    in interleaved rounds: their rows gain confirm_ms."""
    import triton

    from diyflash.kernels.attention import launch as ka
    from diyflash.kernels.attention_configs import bwd_config, fwd_config

    b, h = SHAPES.get(d, (2, 8))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    scale = d ** -0.5
    out, lse = ka.attention_fwd(q, k, v, causal, scale, None)
    dout = torch.randn(q.shape, device="cuda", dtype=dtype, generator=gen)
    current = bwd_config(d, dtype, q.device, causal, False, n)
    ref = (out,) if kind == "fwd" else ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None)
    flops = attention_flops(b, h, n, n, d, causal, "fwd" if kind == "fwd" else "bwd")
    if kind == "dv" and current.dv_pass is None:
        return []  # dk and dv are one pass at this head_dim: no dv pass to tile
    if kind == "fwd":
        default = fwd_config(d, dtype, q.device, causal, False, n)
    elif kind == "dv":
        default = current.dv_pass
    else:
        default = getattr(current, kind)
    rows, fns = [], {}
    for cfg in candidates + ([] if default in candidates else [default]):
        if cost(cfg, d, dtype.itemsize) > limit or (cfg != default and not keep(cfg)):
            continue
        if kind == "fwd":
            fn = lambda cfg=cfg: ka.attention_fwd(q, k, v, causal, scale, None, config=cfg)[:1]  # noqa: E731
        else:
            both = current._replace(**{kind: cfg})
            fn = lambda both=both: ka.attention_bwd(dout, None, q, k, v, out, lse, causal, scale, None, config=both)  # noqa: E731
        try:
            got = fn()
            ok = all((g.float() - r.float()).abs().max().item() < (1e-2 if kind == "fwd" else 5e-2)
                     for g, r in zip(got, ref))
            ms = triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
        except Exception as e:  # out of resources on this GPU: not a candidate here
            print(f"  skip {kind} d={d} causal={causal} {cfg}: {type(e).__name__}: {str(e)[:80]}")
            continue
        rows.append(dict(kind=kind, head_dim=d, n=n, b=b, h=h, causal=causal, ok=ok, ms=ms,
                         tflops=flops / ms / 1e9, is_default=cfg == default, **cfg.as_dict()))
        fns[len(rows) - 1] = fn
    # the first pass times candidates one after the other, minutes apart; the leaders and the current
    # tiles are timed again in turns (interleaved rounds), and that time picks the winner
    leaders = sorted((i for i, r in enumerate(rows) if r["ok"]), key=lambda i: rows[i]["ms"])[:confirm]
    leaders += [i for i, r in enumerate(rows) if r["is_default"] and i not in leaders]
    if confirm and len(leaders) > 1:
        times = interleaved_times({i: fns[i] for i in leaders}, rounds=CONFIRM_ROUNDS, round_ms=CONFIRM_MS)
        for i, t in times.items():
            rows[i]["confirm_ms"] = quantiles(t, (0.5,))[0]
            rows[i]["confirm_tflops"] = flops / rows[i]["confirm_ms"] / 1e9
    return rows


def ranked(rows) -> list:
    """Correct rows, best first: by the interleaved re-timing where a row has one, then the first pass."""
    return sorted((r for r in rows if r["ok"]), key=lambda r: (r.get("confirm_ms") is None, r.get("confirm_ms"), r["ms"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="sequence length")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--causal", choices=["plain", "causal", "both"], default="both")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--out", default=None, help="append every timing here (JSONL)")
    parser.add_argument("--write", action="store_true", help="record the winners in diyflash/kernels/attention_tuned.py")
    parser.add_argument("--bucket", action="store_true",
                        help="the winners serve sequences up to --n only (a length bucket of the entry)")
    parser.add_argument("--confirm", type=int, default=CONFIRM,
                        help="re-time this many leaders and the current tiles in turns; 0: first pass only")
    parser.add_argument("--tma", choices=list(FLAG_FILTERS), default="both",
                        help="candidates with TMA loads, without, or both")
    parser.add_argument("--ws", choices=list(FLAG_FILTERS), default="both",
                        help="candidates with warp-specialized loops, without, or both")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_configs: needs a CUDA GPU", file=sys.stderr)
        return 2

    from diyflash.kernels import attention_tuned
    from diyflash.kernels.attention_configs import CANDIDATES, SMEM_BYTES

    dtype = DTYPES[args.dtype]
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    modes = {"plain": [False], "causal": [True], "both": [False, True]}[args.causal]
    prov = provenance()
    table = {kind: {m: dict(dims) for m, dims in ms.items()} for kind, ms in attention_tuned.TUNED.items()}
    table.setdefault("dv", {"plain": {}, "causal": {}})
    history_row = {"kind": "sweep", "gpu": prov["gpu"], "torch": prov["torch"], "triton": prov["triton"],
                   "dtype": args.dtype, "n": args.n, "timestamp": prov["timestamp"], "command": _command(args)}
    wrote = False
    all_rows = []
    # the backward kernels are swept in turn, each timed next to the others' best so far
    for kind in [k for k in KINDS if k in args.kinds]:
        for d in args.head_dims:
            for causal in modes:
                keep = lambda cfg: FLAG_FILTERS[args.tma](cfg.tma) and FLAG_FILTERS[args.ws](cfg.ws)  # noqa: E731
                rows = sweep_one(kind, d, causal, dtype, args.n, CANDIDATES[kind], SMEM_BYTES[kind], limit,
                                 args.confirm, keep)
                all_rows += rows
                good = ranked(rows)
                bad = [_tiles(r) for r in rows if not r["ok"]]
                if bad:
                    print(f"  WRONG RESULTS {kind} d={d} causal={causal}: {bad}")
                dflt = next((r for r in rows if r["is_default"]), None)
                if not good:
                    continue
                best = good[0]
                key = "confirm_tflops" if "confirm_tflops" in best else "tflops"
                print(f"{kind} d={d} causal={causal}: best {best['block_m']}x{best['block_n']} w{best['num_warps']} "
                      f"s{best['num_stages']}{''.join(' ' + f for f in _tiles(best)[4:])} {best[key]:.0f} TFLOPS; was "
                      + (f"{dflt[key]:.0f}" if dflt else "not a candidate")
                      + (" (timed in turns)" if key == "confirm_tflops" else ""), flush=True)
                mode = "causal" if causal else "plain"
                table[kind][mode][d] = with_winner(table[kind][mode].get(d), _tiles(best), args.n if args.bucket else None)
                if args.write:  # after each winner: later kernels' sweeps run with it
                    _write(table)
                    if not wrote:
                        with open(Path(__file__).parent / "results" / Path(HISTORY).name, "a") as f:
                            f.write(json.dumps(history_row) + "\n")
                        wrote = True
    if args.out:
        with open(args.out, "a") as f:
            for r in all_rows:
                f.write(json.dumps({**prov, "dtype": args.dtype, **r}) + "\n")
    return 0


HISTORY = "bench/results/attention_tuned_history.jsonl"  # append-only: one row per sweep that wrote, per hand edit
FLAG_FILTERS = {"both": lambda flag: True, "only": lambda flag: flag, "none": lambda flag: not flag}


def with_winner(entry, tiles: tuple, bucket: int | None):
    """A table entry after a sweep: the winner for every length (bucket None; other buckets kept), or
    for sequences up to `bucket`, beside what served them before. A bucket holding the same tiles as
    longer sequences is dropped, and an entry left with one bucket is plain tiles."""
    if entry is None or (bucket is None and not isinstance(entry, dict)):
        return tiles
    buckets = {**(entry if isinstance(entry, dict) else {None: entry}), bucket: tiles}
    buckets = {n: t for n, t in buckets.items() if n is None or t != buckets[None]}
    return buckets[None] if len(buckets) == 1 else buckets


def _command(args) -> str:
    """The exact command of a sweep, for its history row."""
    return (f"python -m bench.attention_configs --n {args.n} --dtype {args.dtype} "
            f"--head-dims {' '.join(map(str, args.head_dims))} --causal {args.causal} "
            f"--kinds {' '.join(args.kinds)} --write" + (" --bucket" if args.bucket else "")
            + (f" --confirm {args.confirm}" if args.confirm != CONFIRM else "")
            + (f" --tma {args.tma}" if args.tma != "both" else "")
            + (f" --ws {args.ws}" if args.ws != "both" else ""))


def _write(table) -> None:
    import importlib

    import diyflash
    from diyflash.kernels import attention_configs, attention_tuned

    Path(attention_tuned.__file__).write_text(render_tuned(table))
    importlib.reload(attention_tuned)
    attention_configs.TUNED = attention_tuned.TUNED
    attention_configs.fwd_config.cache_clear()
    attention_configs.bwd_config.cache_clear()
    diyflash.clear_caches()  # plans hold the launches of the old tiles


if __name__ == "__main__":
    sys.exit(main())
