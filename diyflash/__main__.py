"""python -m diyflash: detect the GPU, validate the kernels against the float64 oracle, benchmark.

On a CPU-only machine it says so and runs the very same Triton kernels through Triton's interpreter
on small shapes (re-executing itself with TRITON_INTERPRET=1, which must be set before triton is
imported). Exit status 1 when any validation fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m diyflash", description=__doc__.splitlines()[0])
    p.add_argument("--skip-validate", action="store_true", help="do not validate the kernels")
    p.add_argument("--skip-bench", action="store_true", help="do not benchmark (GPU only)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="sequence length of the validation (default 1024 on GPU, 67 on CPU)")
    p.add_argument("--bench-seq-len", type=int, default=4096,
                   help="sequence length of the benchmark (default 4096: shorter calls at B=4, H=16 take "
                        "less GPU time than an eager call's ~0.1 ms of Python dispatch and measure that)")
    return p.parse_args(argv)


def _reexec_with_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    os.execve(sys.executable, [sys.executable, "-m", "diyflash", *sys.argv[1:]], env)


def validate(device: torch.device, n: int) -> bool:
    from diyflash.utils.validation import attention_error_reports

    def op(q, k, v, causal, scale, seq_lens):
        return torch.ops.diyflash.attention(q, k, v, causal=causal, scale=scale, seq_lens=seq_lens)

    dtypes = [torch.float16, torch.bfloat16, torch.float32] if device.type == "cuda" else [torch.float16, torch.float32]
    head_dims = [64, 128] if device.type == "cuda" else [32]
    ok = True
    print("\nValidation: diyflash.attention (forward + backward) vs a float64 oracle; "
          "pass = error <= 2 x plain PyTorch error in the same dtype + rounding band")
    print(f"{'dtype':<9} {'head_dim':>8} {'causal':>6} {'N_q x N_k':>12}  " + "  ".join(f"{n_:>18}" for n_ in ("out", "dq", "dk", "dv")) + "  verdict")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dtype in dtypes:
        for d in head_dims:
            for causal in (False, True):
                n_q, n_k = n, n + (n // 3 if causal else 0)  # bottom-right causal with N_q != N_k
                q, k, v = (torch.randn(2, 2, m, d, generator=gen).to(device, dtype) for m in (n_q, n_k, n_k))
                _, _, reports = attention_error_reports(op, q, k, v, causal)
                good = all(r.ok for r in reports)
                ok &= good
                cells = "  ".join(f"{r.err:8.1e}/{r.bound:8.1e}" for r in reports)
                print(f"{str(dtype)[6:]:<9} {d:>8} {str(causal):>6} {f'{n_q}x{n_k}':>12}  {cells}  {'ok' if good else 'FAIL'}")
    print("(each cell: kernel error / allowed bound)")
    return ok


def bench(n: int) -> None:
    import triton
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import diyflash

    print("\nBenchmark (medians of triton.testing.do_bench; TFLOPS: fwd 4*B*H*N^2*D, halved when causal; bwd 2.5x)")
    print(f"{'B H N D':<18} {'causal':>6} {'pass':>4} {'diyflash':>9} {'SDPA flash':>11} {'SDPA cuDNN':>11} {'vs flash':>9} {'vs cuDNN':>9}")

    def sdpa(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    providers = {
        "diyflash": lambda q, k, v, causal: diyflash.flash_attention(q, k, v, causal=causal),
        "flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    for b, h, d in ((4, 16, 64), (4, 16, 128)):
        for causal in (False, True):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
            for mode in ("fwd", "bwd"):
                tf = {}
                for name, fn in providers.items():
                    try:
                        if mode == "fwd":
                            call = lambda: fn(q, k, v, causal)  # noqa: E731
                        else:
                            out = fn(q, k, v, causal)
                            g = torch.randn_like(out)
                            call = lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)  # noqa: E731
                        # untimed calls first: a fresh kernel compiles for seconds with the GPU idle, and a
                        # short warm-up right after it reads ~2x slow
                        for _ in range(3):
                            call()
                        torch.cuda.synchronize()
                        ms = triton.testing.do_bench(call, warmup=100, rep=200, return_mode="median")
                    except Exception:  # a backend that does not run here
                        continue
                    flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0) * (2.5 if mode == "bwd" else 1.0)
                    tf[name] = flops / ms / 1e9
                mine = tf.get("diyflash")

                def show(x):
                    return f"{x:.0f}" if x else "-"

                def ratio(base):
                    return f"{mine / tf[base]:.2f}x" if mine and tf.get(base) else "-"

                print(f"{f'{b} {h} {n} {d}':<18} {str(causal):>6} {mode:>4} {show(mine):>9} {show(tf.get('flash')):>11} "
                      f"{show(tf.get('cudnn')):>11} {ratio('flash'):>9} {ratio('cudnn'):>9}")


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    from diyflash.kernels import interpreter_active

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not interpreter_active():
        _reexec_with_interpreter()

    import diyflash

    print(f"diyflash {diyflash.__version__} | torch {torch.__version__}", end="")
    try:
        import triton

        print(f" | triton {triton.__version__}")
    except ModuleNotFoundError:
        print(" | triton not installed")
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        print(f"GPU: {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
              f"{props.total_memory / 2**30:.0f} GiB)")
        device, n = torch.device("cuda"), args.seq_len or 1024
    else:
        print("no GPU: running the Triton kernels through the interpreter on small shapes")
        device, n = torch.device("cpu"), args.seq_len or 67

    ok = True
    if not args.skip_validate:
        ok = validate(device, n)
        print("validation:", "PASSED" if ok else "FAILED")
    if on_gpu and not args.skip_bench:
        bench(args.bench_seq_len)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
