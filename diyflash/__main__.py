"""python -m diyflash: detect the GPU, validate the kernels against a float64 oracle, benchmark them.

Validation checks attention (forward and backward; dense cells, then one cell per dtype with every
variant at once: GQA, D_v != D, window, softcap, ALiBi, sinks) and matmul (C, dA, dB) with flash-attn's rule:
the kernel's error is at most 2x plain PyTorch's error in the same dtype plus a rounding band.
On a GPU a short benchmark follows (diyflash vs SDPA flash/cuDNN and vs cuBLAS, in the same run).
On a CPU-only machine it says so and runs the very same Triton kernels through Triton's interpreter on
small shapes (re-executing itself with TRITON_INTERPRET=1, which must be set before triton is imported).
Exit status 1 when any validation fails.

On a GPU the kernels that validation and the benchmark will need are first compiled in parallel worker
processes (diyflash/precompile.py), unless an earlier run already put them in Triton's disk cache; the
matmul tuner's choices persist on disk too. Every step prints a status line with the elapsed time.
`python -m diyflash precompile --help`: compile given shapes ahead of a job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def _head_dim(text: str) -> int:
    from diyflash.ops.checks import head_dim_error

    value = _int_at_least(8)(text)
    if head_dim_error(value):
        raise argparse.ArgumentTypeError(head_dim_error(value))
    return value


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m diyflash", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=["attention", "matmul"], default=["attention", "matmul"],
                   help="which operators to validate and benchmark")
    p.add_argument("--skip-validate", action="store_true", help="do not validate the kernels")
    p.add_argument("--skip-bench", action="store_true", help="do not benchmark (GPU only)")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=None,
                   help="dtypes to validate (default: fp16 bf16 fp32 on a GPU, fp16 fp32 on CPU)")
    p.add_argument("--causal", choices=["both", "true", "false"], default="both", help="attention masks")
    p.add_argument("--head-dims", type=_head_dim, nargs="+", default=None,
                   help="attention head dims (default: 64 128 on a GPU, 32 on CPU)")
    p.add_argument("--seq-len", type=_int_at_least(1), default=None,
                   help="attention validation length (default 1024 on a GPU, 67 on CPU)")
    p.add_argument("--matmul-size", type=_int_at_least(4), default=None,
                   help="matmul validation size M=N=K-ish, at least 4 (default 1000 on a GPU, 70 on CPU)")
    p.add_argument("--bench-seq-len", type=_int_at_least(1), default=4096,
                   help="attention benchmark length (shorter calls at B=4, H=16 take less GPU time than an "
                        "eager call's ~0.1 ms of Python dispatch and measure that)")
    return p.parse_args(argv)


def _reexec_with_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    os.execve(sys.executable, [sys.executable, "-m", "diyflash", *sys.argv[1:]], env)


_START = time.perf_counter()


def _stamp() -> str:
    return f"[{time.perf_counter() - _START:6.1f}s]"


def _begin(text: str) -> None:
    # the status line goes out before the step runs (compiling, tuning): a long step never sits silent
    print(f"  {_stamp()} {text}", end="", flush=True)


def _cells(reports) -> str:
    return "  ".join(f"{r.name} {r.err:7.1e}/{r.bound:7.1e}" for r in reports)


def validate_attention_part(device, dtypes, head_dims, causals, n) -> bool:
    import diyflash
    from diyflash.utils.validation import attention_error_reports

    def op(q, k, v, causal, scale, seq_lens):
        # the public call (its eager path runs the implementation the op runs: tests/test_eager.py), not
        # the op by name, whose first call in a process imports torch._dynamo (PyTorch's custom-op layer):
        # 4.5 s where Python has no cached bytecode (bench/results/coldstart_mainjob_ab_h200.jsonl)
        return diyflash.flash_attention(q, k, v, causal, scale, seq_lens)

    ok = True
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dtype in dtypes:
        for d, causal, n_q, n_k in _attention_cells(head_dims, causals, n):  # causal: N_q != N_k (bottom-right)
            q, k, v = (torch.randn(2, 2, m, d, generator=gen).to(device, dtype) for m in (n_q, n_k, n_k))
            _begin(f"attention {str(dtype)[6:]:<8} d={d:<3} causal={str(causal):<5} {n_q}x{n_k}:  ")
            _, _, reports = attention_error_reports(op, q, k, v, causal)
            good = all(r.ok for r in reports)
            ok &= good
            print(f"{_cells(reports)}  {'ok' if good else 'FAIL'}", flush=True)
    for dtype in dtypes:
        ok &= validate_variants_cell(device, dtype, head_dims[0], n, gen)
    return ok


def validate_variants_cell(device, dtype, d, n, gen) -> bool:
    """One cell with every variant at once: GQA 4/2, D_v = D/2 (at least 8), a causal window
    of n/4 keys, softcap 20, per-head ALiBi slopes and sinks, N_k = N_q + 5; out, dq, dk, dv and dsinks."""
    from diyflash.reference import attention_ref
    from diyflash.utils.validation import compare_with_oracle, variants_call, variants_cell

    q, k, v, sinks, kw = variants_cell(device, dtype, d, n, gen)
    dv = v.shape[-1]

    def ours(q, k, v, s):
        return variants_call(q, k, v, s, kw)

    def ref(q, k, v, s, upcast):
        return attention_ref(q, k, v, True, upcast=upcast, sinks=s, **kw)[0]

    _begin(f"variants  {str(dtype)[6:]:<8} d={d}/{dv} GQA 4/2 window softcap alibi sinks {n}x{n + 5}:  ")
    _, _, reports = compare_with_oracle(ours, ref, (q, k, v, sinks), "out", ("dq", "dk", "dv", "dsinks"))
    good = all(r.ok for r in reports)
    print(f"{_cells(reports)}  {'ok' if good else 'FAIL'}", flush=True)
    return good


def _matmul_shapes(size: int) -> list[tuple[int, int, int]]:
    return [(size, size + 17, size - 3), (size // 2 + 1, size, size + 31)]  # (m, k, n): odd edges on every side


def _attention_cells(head_dims, causals, n) -> list[tuple[int, bool, int, int]]:
    return [(d, causal, n, n + (n // 3 if causal else 0)) for d in head_dims for causal in causals]


BENCH_ATTENTION = ((4, 16, 64), (4, 16, 128))  # (B, H, D), fp16, causal and not
BENCH_MATMUL = ((4096, 4096, 4096), (8192, 4096, 11008), (8192, 11008, 4096))  # (M, K, N), fp16


def precompile_part(args, dtypes, head_dims, causals, n, size) -> None:
    """Compile what validation and the benchmark will launch, in parallel worker processes, unless an
    earlier run did so into the same Triton cache."""
    from diyflash.precompile import Job, is_precompiled, matmul_jobs, precompile_jobs

    names = {v: k for k, v in DTYPES.items()}
    jobs = []
    if not args.skip_validate:
        if "attention" in args.parts:
            jobs += [Job("attention", names[dt], (2, 2, n_q, n_k, d), causal=c)
                     for dt in dtypes for d, c, n_q, n_k in _attention_cells(head_dims, causals, n)]
            jobs += [Job("attention", names[dt], (1, 4, n, n + 5, head_dims[0]), causal=True, variants=True)
                     for dt in dtypes]  # validate_variants_cell's call
        if "matmul" in args.parts:
            jobs += [Job("matmul", names[dt], shape, b_transposed=t)
                     for dt in dtypes for shape in _matmul_shapes(size) for t in (False, True)]
    tune = []
    if not args.skip_bench:
        if "attention" in args.parts:
            jobs += [Job("attention", "fp16", (b, h, args.bench_seq_len, args.bench_seq_len, d), causal=c)
                     for b, h, d in BENCH_ATTENTION for c in (False, True)]
        if "matmul" in args.parts:
            jobs += matmul_jobs(["fp16"], BENCH_MATMUL, autotune=True)
            tune = [("fp16", shape, False) for shape in BENCH_MATMUL]
    if not jobs:
        return
    if is_precompiled(jobs):
        print(f"\n{_stamp()} kernels: compiled by an earlier run (Triton's disk cache), nothing to precompile")
        return
    print(f"\n{_stamp()} compiling the kernels this run needs in parallel (cold Triton cache)", flush=True)
    precompile_jobs(jobs, tune=tune, log=lambda line: print(line, flush=True))


def validate_matmul_part(device, dtypes, size) -> bool:
    import diyflash
    from diyflash.utils.validation import matmul_error_reports

    ok = True
    gen = torch.Generator(device="cpu").manual_seed(1)
    shapes = _matmul_shapes(size)
    for dtype in dtypes:
        for m, k, n in shapes:
            for trans in (False, True):  # b given as the transposed view of (n, k) storage, read in place
                a = torch.randn(m, k, generator=gen).to(device, dtype)
                b = (torch.randn(n, k, generator=gen).to(device, dtype).mT if trans
                     else torch.randn(k, n, generator=gen).to(device, dtype))
                _begin(f"matmul    {str(dtype)[6:]:<8} {m}x{k} @ {k}x{n}{' (b = view.mT)' if trans else ''}:  ")
                # the untuned default tiles (and, as the backward takes the forward's choice, for dA and
                # dB too): tuning every bucket here cost most of a run; the benchmark below autotunes
                _, _, reports = matmul_error_reports(lambda a, b: diyflash.triton_matmul(a, b, use_autotune=False), a, b)
                good = all(r.ok for r in reports)
                ok &= good
                print(f"{_cells(reports)}  {'ok' if good else 'FAIL'}", flush=True)
    return ok


def _time(call) -> float:
    import triton

    for _ in range(3):  # a fresh kernel compiles (and matmul autotunes) on its first calls
        call()
    torch.cuda.synchronize()
    # 10 ms of warm-up and 40 ms of samples per cell: a median over 10-100 ms-scale calls. The main job is a
    # check a user runs on a new machine, not the benchmark (bench/attention.py times in turns); at 25/100 ms
    # its 30 timings took 4.6 s of a warm run (H200)
    return triton.testing.do_bench(call, warmup=10, rep=40, return_mode="median")


def bench_attention(n: int) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import diyflash

    def sdpa(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    providers = {"diyflash": lambda q, k, v, causal: diyflash.flash_attention(q, k, v, causal=causal),
                 "flash": sdpa(SDPBackend.FLASH_ATTENTION), "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    print(f"\n{_stamp()} Attention, fp16 (TFLOPS: fwd 4*B*H*N^2*D, halved when causal; bwd 2.5x fwd, timed alone)")
    print(f"  {'':9}{'B H N D':<16} {'causal':>6} {'pass':>4} {'diyflash':>9} {'SDPA flash':>11} {'SDPA cuDNN':>11} "
          f"{'vs flash':>9} {'vs cuDNN':>9}")
    for b, h, d in BENCH_ATTENTION:
        for causal in (False, True):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
            for mode in ("fwd", "bwd"):
                tf = {}
                for name, fn in providers.items():
                    try:
                        if mode == "fwd":
                            ms = _time(lambda: fn(q, k, v, causal))
                        else:
                            out = fn(q, k, v, causal)
                            g = torch.randn_like(out)
                            ms = _time(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True))
                    except Exception:  # a backend that does not run this shape here
                        continue
                    tf[name] = 4 * b * h * n * n * d * (0.5 if causal else 1.0) * (2.5 if mode == "bwd" else 1.0) / ms / 1e9
                _row(f"{b} {h} {n} {d}", f"{str(causal):>6} {mode:>4}", tf, ("flash", "cudnn"))


def bench_matmul() -> None:
    import diyflash

    print(f"\n{_stamp()} Matmul, fp16 (TFLOPS = 2*M*N*K / time; diyflash autotuned per shape bucket, choices kept on disk)")
    print(f"  {'':9}{'M x K x N':<16} {'':>11} {'diyflash':>9} {'cuBLAS':>11} {'':>11} {'vs cuBLAS':>9}")
    for m, k, n in BENCH_MATMUL:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        tf = {name: 2.0 * m * n * k / _time(fn) / 1e9
              for name, fn in (("diyflash", lambda: diyflash.triton_matmul(a, b)), ("cublas", lambda: a @ b))}
        _row(f"{m}x{k}x{n}", " " * 11, tf, ("cublas",))


def _row(label, middle, tf, baselines) -> None:
    mine = tf.get("diyflash")
    show = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
    ratio = lambda base: f"{mine / tf[base]:.2f}x" if mine and tf.get(base) else "-"  # noqa: E731
    cols = [f"{show(tf.get(base)):>11}" for base in baselines] + [" " * 11] * (2 - len(baselines))
    ratios = [f"{ratio(base):>9}" for base in baselines]
    print(f"  {_stamp()} {label:<16} {middle} {show(mine):>9} {' '.join(cols)} {' '.join(ratios)}", flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["precompile"]:
        from diyflash.precompile import main as precompile_main

        return precompile_main(argv[1:])
    args = _parse(argv)
    from diyflash.ops.runtime import interpreter_active

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not interpreter_active():
        _reexec_with_interpreter()

    import diyflash
    from diyflash.utils.gpu import print_gpu_info

    print(f"diyflash {diyflash.__version__} | torch {torch.__version__}", end="")
    try:
        import triton

        print(f" | triton {triton.__version__}")
    except ModuleNotFoundError:
        print(" | triton not installed")
    if on_gpu:
        from diyflash.ops.runtime import attention_backend

        print_gpu_info()
        device = torch.device("cuda")
        if "attention" in args.parts:
            print(f"attention forward: {attention_backend(device)}")
            print(f"attention backward: {attention_backend(device, backward=True)}")
    else:
        print("no GPU: running the Triton kernels through the interpreter on small shapes")
        device = torch.device("cpu")
    dtypes = [DTYPES[d] for d in (args.dtypes or (["fp16", "bf16", "fp32"] if on_gpu else ["fp16", "fp32"]))]
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]

    head_dims = args.head_dims or ([64, 128] if on_gpu else [32])
    n = args.seq_len or (1024 if on_gpu else 67)
    size = args.matmul_size or (1000 if on_gpu else 70)
    if on_gpu:
        precompile_part(args, dtypes, head_dims, causals, n, size)

    ok = True
    if not args.skip_validate:
        print(f"\n{_stamp()} Validation vs a float64 oracle: each cell is kernel error / allowed bound "
              "(2 x plain PyTorch error in the same dtype + rounding band)")
        if "attention" in args.parts:
            ok &= validate_attention_part(device, dtypes, head_dims, causals, n)
        if "matmul" in args.parts:
            ok &= validate_matmul_part(device, dtypes, size)
        print(f"{_stamp()} validation:", "PASSED" if ok else "FAILED", flush=True)
    if on_gpu and not args.skip_bench:
        if "attention" in args.parts:
            bench_attention(args.bench_seq_len)
        if "matmul" in args.parts:
            bench_matmul()
    print(f"\n{_stamp()} done", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
