"""Probe (issue 25): what one decode cell's measured time is made of, for diyflash and its SDPA peers.

bench.decode times one call as a CUDA graph replay under triton.testing.do_bench, which zeroes a 256 MB
buffer before every replay (to empty the L2 of the previous call's data). Those writes leave the L2 full
of dirty lines, which the next kernel's reads evict, writing them back to HBM during the timed call; and
each timed replay pays one graph launch. Three measures of the same calls, side by side:
  flush   bench.decode's: do_bench (zeroing flush) around one graph replay of one call;
  scrub   one call per replay, the L2 emptied by *reading* a 256 MB buffer before each replay (clean lines,
          nothing to write back), events around the replay;
  steady  a graph of R calls in a row, each on its own copy of the cache (C copies, R a multiple of C,
          C x cache >= 256 MB, so no call finds its keys in the L2), scrubbed as above, time / R: the
          per-step time of back-to-back decode calls, as in a captured decode loop of many layers.
An empty kernel is timed the same three ways (the floor). Every provider reads the same bytes.
    python -m bench.probes.decode_timing [--out probe.jsonl]"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import diyflash
from bench.common import clean_graph_ms, graph_ms, provenance
from bench.decode import copy_bandwidth, shuffled_pages
from bench.probes.decode_probe import _empty

H, H_KV, D = 32, 8, 128
CELLS = [(1, 1024), (1, 8192), (1, 65536), (1, 131072), (8, 8192), (64, 1024), (64, 8192)]
L2_SPAN = 256 << 20  # bytes that no L2 of these GPUs holds (clean_graph_ms reads as many)


def providers(b, n, copies):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    kv = []
    for _ in range(copies):
        k = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
        v = torch.randn(b, n, H_KV, D, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
        kv.append((k, v, k.contiguous(), v.contiguous()))

    def ours(contiguous):  # the (B, L, H_kv, D) buffer read through .transpose(1, 2), or its contiguous copy
        def make(i):
            k, v = kv[i][2:] if contiguous else kv[i][:2]
            return lambda: diyflash.flash_attention_with_kvcache(q, k, v, lens, validate=False)
        return make

    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    one_per_sm = max(1, sms // (b * H_KV))
    paged = [shuffled_pages(k, v) for k, v, _, _ in kv]  # the same keys in shuffled pages of 256 rows

    def ours_paged(splits):
        def make(i):
            k, v, table = paged[i]
            return lambda: diyflash.flash_attention_with_kvcache(q, k, v, lens, block_table=table, num_splits=splits,
                                                                 validate=False)
        return make

    def sdpa(backend):
        def make(i):
            k, v = kv[i][2], kv[i][3]

            def run():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            return run
        return make

    return {"diyflash": ours(False), "diyflash-contig": ours(True), "diyflash-paged": ours_paged(0),
            "diyflash-paged-1/SM": ours_paged(one_per_sm), "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
            "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--providers", nargs="*", default=None, help="only these (default: all)")
    parser.add_argument("--cells", nargs="*", default=None, help="only these, as BxL (default: all)")
    parser.add_argument("--no-flush", action="store_true", help="skip the flush measure (do_bench's)")
    args = parser.parse_args()
    cells = CELLS if not args.cells else [tuple(map(int, c.split("x"))) for c in args.cells]
    copy = copy_bandwidth()
    x = torch.zeros(1, device="cuda")
    empty = lambda: _empty[(1,)](x)  # noqa: E731
    floor = dict(flush=graph_ms(empty) * 1e3, scrub=clean_graph_ms([empty]) * 1e3,
                 steady=clean_graph_ms([empty] * 16) * 1e3 / 16)
    print(f"# {torch.cuda.get_device_name()} | copy {copy / 1e12:.2f} TB/s | empty kernel: flush "
          f"{floor['flush']:.1f} us, scrub {floor['scrub']:.1f} us, steady {floor['steady']:.1f} us a call")
    rows = [dict(cell="empty", **floor, **provenance())]
    print("cell        provider          flush us (share)   scrub us (share)   steady us (share)   R x C")
    for b, n in cells:
        kv_bytes = 2 * b * n * H_KV * D * 2
        copies = max(2, math.ceil(L2_SPAN / kv_bytes))
        reps = copies * max(1, math.ceil(8 / copies))
        for name, make in providers(b, n, copies).items():
            if args.providers and name not in args.providers:
                continue
            try:
                one = make(0)
                one()
                t = dict(flush=float("nan") if args.no_flush else graph_ms(one) * 1e3, scrub=clean_graph_ms([one]) * 1e3,
                         steady=clean_graph_ms([make(i % copies) for i in range(reps)]) * 1e3 / reps)
            except Exception as e:  # a backend that refuses the shape
                print(f"B{b} L{n}: {name}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
                continue
            share = {k: kv_bytes / (us * 1e-6) / copy for k, us in t.items()}
            rows.append(dict(cell=f"B{b} L{n}", b=b, n=n, provider=name, copies=copies, reps=reps, copy_tbps=copy / 1e12,
                             **t, share=share))
            print(f"B{b} L{n:<7} {name:<16}" + "".join(f" {t[k]:9.1f} ({100 * share[k]:3.0f}%)     "
                                                       for k in ("flush", "scrub", "steady")) + f" {reps} x {copies}",
                  flush=True)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
