"""Packed-sequence training (issue 25): varlen forward + backward against peers in the same run.

    python -m bench.varlen [--out results.jsonl]

64 documents, lengths log-uniform in 128..8192 scaled to 65536 tokens in total (seeded), H=16, D=128,
bf16, causal. FLOPs count each document's own causal attention (bench.common.attention_flops).
Providers: diyflash.flash_attention_varlen; FlexAttention (compiled) on the packed (1, H, T, D) batch with
a document-causal block mask; SDPA (flash backend) on the zero-padded (64, H, max_len, D) batch (its
padded rows are wasted work, which is what padding costs); and diyflash's dense kernel on the same number
of tokens as B = 64 sequences of 1024 (the mean document length), for TFLOPS on equal tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import attention_flops, compiled_flex, interleaved_times, provenance, quantiles

H, D, DOCS, TOKENS = 16, 128, 64, 65536


def doc_lengths(seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.exp(torch.empty(DOCS).uniform_(math.log(128), math.log(8192), generator=gen))
    lens = (raw / raw.sum() * TOKENS).round().clamp(128, 8192).long()
    lens[-1] += TOKENS - int(lens.sum())
    return lens.tolist()


def fwd_bwd(fn, leaves):
    out = fn(*leaves)
    dout = torch.randn_like(out)

    def step():
        o = fn(*leaves)
        return torch.autograd.grad(o, leaves, dout)
    return step


def main(argv=None) -> int:
    import diyflash

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    lens = doc_lengths()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    max_len = max(lens)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    flops_fwd = sum(attention_flops(1, H, n, n, D, True, "fwd") for n in lens)
    flops = flops_fwd * 3.5  # forward + backward (2.5 x forward)

    fns = {"diyflash-varlen": fwd_bwd(lambda q, k, v: diyflash.flash_attention_varlen(q, k, v, cu, cu, max_len,
                                                                                       max_len, True), [q, k, v])}
    # dense on equal tokens: 64 x 1024
    dq, dk, dv = (t.detach().view(64, 1024, H, D).transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    dense_flops = attention_flops(64, H, 1024, 1024, D, True, "fwd") * 3.5
    fns["diyflash-dense-64x1024"] = fwd_bwd(lambda q, k, v: diyflash.flash_attention(q, k, v, True), [dq, dk, dv])
    # SDPA on the padded batch
    padded = []
    for t in (q, k, v):
        p = torch.zeros(DOCS, max_len, H, D, device="cuda", dtype=torch.bfloat16)
        for i, n in enumerate(lens):
            p[i, :n] = t.detach()[cu[i]:cu[i] + n]
        padded.append(p.transpose(1, 2).requires_grad_())

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fns["sdpa-flash-padded"] = fwd_bwd(sdpa, padded)
    flex = compiled_flex()
    if flex is not None:
        from torch.nn.attention.flex_attention import create_block_mask

        doc = torch.repeat_interleave(torch.arange(DOCS, device="cuda"), torch.tensor(lens, device="cuda"))

        def mask_mod(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (ki <= qi)
        block_mask = create_block_mask(mask_mod, 1, 1, TOKENS, TOKENS, device="cuda")
        packed = [t.detach().transpose(0, 1).unsqueeze(0).requires_grad_() for t in (q, k, v)]
        fns["flex-doc-mask"] = fwd_bwd(lambda q, k, v: flex(q, k, v, block_mask=block_mask), packed)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = interleaved_times(fns, rounds=args.rounds)
    row = dict(docs=DOCS, tokens=TOKENS, h=H, d=D, max_len=max_len, **provenance())
    for name, t in times.items():
        med = quantiles(t, (0.5,))[0]
        f = dense_flops if name.startswith("diyflash-dense") else flops
        row[name] = dict(ms=med, tflops=f / (med * 1e-3) / 1e12)
    ours = row["diyflash-varlen"]["ms"]
    print(f"varlen training, {DOCS} docs, {TOKENS} tokens (max {max_len}), H{H} D{D} bf16 causal fwd+bwd")
    print("| provider | ms | TFLOPS | ours faster by |")
    print("|---|---|---|---|")
    for name in fns:
        r = row[name]
        print(f"| {name} | {r['ms']:.2f} | {r['tflops']:.0f} | {r['ms'] / ours:.2f}x |")
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
