"""KV-cache decode (issue 25): achieved HBM bandwidth of one decode step against peers in the same run.

    python -m bench.decode [--out results.jsonl] [--quick]

Each cell (B, L): q (B, 32, 1, 128) bf16 against a cache of L keys per batch (8 kv heads), contiguous
and paged (page 256). Bandwidth = bytes of K and V read (2 * B * L * 8 * 128 * 2) / GPU time, as a share
of the device's copy bandwidth measured in the same run (a 1 GiB device-to-device copy: read + write
bytes / time). GPU time is one CUDA graph replay of one call, the L2 emptied before it by reading 256 MB
(clean_graph_ms: no host cost, one graph launch included). It was do_bench's replay before
(graph_ms, kept as "flush_us"), whose zeroing flush leaves the L2 dirty: its write-back ran inside every
timed call, +9-10 us on a 268 MB read for every provider (the decode_timing probe). "eager us" is the
wall time per call of 200 eager calls in a row (host cost included; the default validate=True syncs once a call,
diyflash-novalidate skips that check; diyflash-dense is flash_attention, the dense API, at N_q = 1).
Peers: SDPA with every backend that takes the shape (enable_gqa=True) and FlexAttention's decode path
(compiled), all on the same contiguous cache.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import clean_graph_ms, compiled_flex, graph_ms, per_call_us, provenance

H, H_KV, D = 32, 8, 128
CELLS = [(1, 1024), (1, 8192), (1, 65536), (1, 131072), (8, 8192), (8, 65536), (64, 1024), (64, 8192), (64, 32768)]
QUICK = [(1, 8192), (1, 65536), (8, 8192), (64, 8192)]


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read + write), median of do_bench."""
    import triton

    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def shuffled_pages(k: torch.Tensor, v: torch.Tensor, page: int = 256):
    """The keys and values (B, H_kv, L, D) in pages of `page` rows in a shuffled pool: k_pages, v_pages
    (B * L / page, H_kv, page, D) and the block table (B, L / page) int32 that finds them."""
    b, _, n, _ = k.shape
    pages = n // page
    order = torch.randperm(b * pages, generator=torch.Generator().manual_seed(1)).to(k.device)
    k_pages, v_pages = (t.unflatten(2, (pages, page)).permute(0, 2, 1, 3, 4).flatten(0, 1)[order].contiguous()
                        for t in (k, v))
    table = torch.empty(b * pages, dtype=torch.int32, device=k.device)
    table[order] = torch.arange(b * pages, dtype=torch.int32, device=k.device)
    return k_pages, v_pages, table.view(b, pages)


def providers(b: int, n: int):
    import diyflash

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    v = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    k_pages, v_pages, table = shuffled_pages(k, v)
    kc, vc = k.contiguous(), v.contiguous()  # SDPA backends want (B, H, L, D) dense

    fns = {
        "diyflash": lambda: diyflash.flash_attention_with_kvcache(q, k, v, seqlens),
        "diyflash-novalidate": lambda: diyflash.flash_attention_with_kvcache(q, k, v, seqlens, validate=False),
        "diyflash-paged": lambda: diyflash.flash_attention_with_kvcache(q, k_pages, v_pages, seqlens, block_table=table),
        # the dense API at N_q = 1 (what the transformers backend calls in an unpadded generate step)
        "diyflash-dense": lambda: diyflash.flash_attention(q, k, v, causal=True),
    }
    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        fns[name] = run
    flex = compiled_flex()
    if flex is not None:
        fns["flex"] = lambda: flex(q, kc, vc, enable_gqa=True)
    want = diyflash.flash_attention_with_kvcache(q, k, v, seqlens).float()
    return fns, want


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    copy_bw = copy_bandwidth()
    rows = []
    for b, n in QUICK if args.quick else CELLS:
        fns, want = providers(b, n)
        kv_bytes = 2 * b * n * H_KV * D * 2
        row = dict(b=b, n=n, copy_tbps=copy_bw / 1e12, **provenance())
        for name, fn in fns.items():
            try:
                got = fn().float()
                err = (got - want).abs().max().item()
                ms = clean_graph_ms([fn])
                row[name] = dict(us=ms * 1e3, bw_share=kv_bytes / (ms * 1e-3) / copy_bw, flush_us=graph_ms(fn) * 1e3,
                                 eager_us=per_call_us(fn, 200, warmup=1), max_diff=err)
            except Exception as e:  # a backend that refuses the shape: recorded, not timed
                row[name] = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            torch.cuda.synchronize()
        rows.append(row)
        print(line(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print(table(rows))
    return 0


NAMES = ("diyflash", "diyflash-novalidate", "diyflash-paged", "diyflash-dense", "sdpa-flash", "sdpa-cudnn",
         "sdpa-efficient", "flex")


def line(row) -> str:
    cells = []
    for name in NAMES:
        r = row.get(name, {})
        timed = "-" if "us" not in r else "%.1fus %.0f%%" % (r["us"], 100 * r["bw_share"])
        cells.append(f"{name} {timed}")
    return f"B{row['b']} L{row['n']}: " + ", ".join(cells)


def table(rows) -> str:
    head = ("| B | L | " + " | ".join(NAMES)
            + " | ours / cuDNN | ours eager us | ours eager us, validate=False | cuDNN eager us |")
    out = [f"copy bandwidth {rows[0]['copy_tbps']:.2f} TB/s (share of it, GPU time of a CUDA graph replay, clean L2)", head,
           "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        shares = [f"{100 * row[n]['bw_share']:.0f}%" if "bw_share" in row.get(n, {}) else "-" for n in NAMES]
        ours, cudnn = row.get("diyflash", {}), row.get("sdpa-cudnn", {})
        ratio = f"{cudnn['us'] / ours['us']:.2f}x" if "us" in ours and "us" in cudnn else "-"
        out.append(f"| {row['b']} | {row['n']} | " + " | ".join(shares) + f" | {ratio} | "
                   f"{ours.get('eager_us', float('nan')):.1f} | "
                   f"{row.get('diyflash-novalidate', {}).get('eager_us', float('nan')):.1f} | "
                   f"{cudnn.get('eager_us', float('nan')):.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
