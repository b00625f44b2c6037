"""At which score magnitude do the attention kernels stop being finite and exact? A few rows of q and
keys of k get one entry of size M (so the scores of those rows reach ~M^2/8); prints, per M and provider,
whether out / grads are finite and the max error against the float64 oracle (--out: also as JSONL rows
with provenance).
    python -m bench.huge_scores [--dtype bf16] [--out F.jsonl]"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import diyflash
from bench.common import provenance
from bench.plots import write_jsonl
from diyflash.reference import attention_ref


def inputs(m, dtype, device, gen=None):
    """q, k, v (1, 2, 256, 64) with entries of size m in a few rows of q and keys of k; `gen` (a CPU
    generator, default seeded 0) draws the rest (the GPU test goes on drawing from it)."""
    gen = torch.Generator(device="cpu").manual_seed(0) if gen is None else gen
    q, k, v = (torch.randn(1, 2, 256, 64, generator=gen) for _ in range(3))
    q[:, :, 100, 0] = m
    q[:, 1, 133, 0] = -m
    k[:, :, 5, 0] = m
    k[:, :, 2, 0] = -m
    k[:, 0, 200, 0] = 0.7 * m
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def providers():
    out = {"diyflash": lambda q, k, v, c: diyflash.flash_attention(q, k, v, causal=c)}
    if torch.cuda.is_available():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa-math", SDPBackend.MATH)):
            def run(q, k, v, c, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=c)
            out[name] = run
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--out", default=None, help="write the rows as JSONL")
    args = parser.parse_args()
    prov = dict(provenance(), dtype=args.dtype, shape="B1 H2 N256 D64 causal")  # inputs()' shape
    rows = []
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"# {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} | {args.dtype} | {prov['shape']}")
    print(f"{'M':>8} {'max|s|':>9} {'provider':>11} {'out':>5} {'grads':>5} {'out err':>9} {'dq err':>9} {'dk err':>9}")
    for m in (1e2, 1e3, 1e4, 3e4, 1e5, 1e6, 1e9, 3e19):
        if dtype == torch.float16 and m > 6e4:
            continue
        q, k, v = inputs(m, dtype, device)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        ref = attention_ref(*leaves, causal=True)[0]
        g = torch.randn_like(ref)
        want = torch.autograd.grad(ref, leaves, g)
        smax = (m * m / 8)
        for name, fn in providers().items():
            ins = [t.clone().requires_grad_() for t in (q, k, v)]
            try:
                out = fn(*ins, True)
                grads = torch.autograd.grad(out, ins, g.to(dtype))
            except Exception as e:  # noqa: BLE001  (a probe: report and go on)
                print(f"{m:8.0e} {smax:9.1e} {name:>11} error {type(e).__name__}: {str(e)[:60]}")
                rows.append(dict(prov, m=m, max_score=smax, provider=name, error=f"{type(e).__name__}: {e}"[:200]))
                continue
            fin = bool(torch.isfinite(out).all())
            gfin = all(bool(torch.isfinite(t).all()) for t in grads)
            errs = [(a.double() - b).abs().max().item() for a, b in ((out, ref), (grads[0], want[0]), (grads[1], want[1]))]
            print(f"{m:8.0e} {smax:9.1e} {name:>11} {str(fin):>5} {str(gfin):>5} " + " ".join(f"{e:9.2e}" for e in errs))
            rows.append(dict(prov, m=m, max_score=smax, provider=name, out_finite=fin, grads_finite=gfin,
                             out_err=errs[0], dq_err=errs[1], dk_err=errs[2]))
    if args.out:
        write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
