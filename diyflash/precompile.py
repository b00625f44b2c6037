"""Compile (and tune) the kernels a job will need before it needs them, in parallel worker processes.

Triton compiles a kernel the first time a process launches it with a new specialization, one kernel
after the other, and most of that is CPU work: on a fresh H200 machine `python -m diyflash` spent over
150 s validating, nearly all of it compiling. Compiled kernels land in Triton's disk cache
(`$TRITON_CACHE_DIR`, default `~/.triton/cache`), and the matmul tuner's choices in diyflash's
(`$DIYFLASH_CACHE_DIR`, kernels/tuning_cache.py), so work done by any process serves every later one.

`precompile` runs the calls a job will make, on the job's real shapes (the shapes pick the kernel
variants: full or partial blocks, 32- or 64-bit offsets, host or device TMA descriptors), spread over
worker processes, one per CPU core up to the number of jobs; the parent then times the matmul
candidates of each shape (the GPU must be quiet for that) and stores the winners. Serving and CI images
can run it once at build time:

    python -m diyflash precompile --dtypes bf16 --head-dims 128 --causal true --shapes 8x32x4096 --kv-heads 8
    diyflash.precompile(dtypes=("bf16",), head_dims=(128,), causal=(True,), shapes=((8, 32, 4096),), kv_heads=(8,))
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
MAX_WORKERS = 16


@dataclass(frozen=True)
class Job:
    """One call to make once: an attention forward (and backward) or a matmul (and its gradients).

    attention: shape (B, H, N_q, N_k, D), `causal`, `kv_heads` (GQA: H_kv of k and v; 0: H) and `window`
    (flash_attention's window_size); `variants`: the main job's cell with every variant at once
    (utils.validation.variants_cell, built from N_q and D). matmul: shape (M, K, N), `b_transposed` (b given
    as the transpose of (N, K) storage), `autotune` (False: the untuned default tiles), or `tiles` (one tuner
    candidate's fields, forward only: compiled here, timed later by the tuner)."""

    kind: str
    dtype: str
    shape: tuple
    causal: bool = False
    backward: bool = True
    b_transposed: bool = False
    autotune: bool = False
    tiles: tuple | None = None
    variants: bool = False
    kv_heads: int = 0
    window: tuple = (-1, -1)

    def label(self) -> str:
        dims = "x".join(map(str, self.shape))
        if self.kind == "attention":
            if self.kv_heads:
                b, h, *rest = self.shape
                dims = "x".join(map(str, (b, f"{h}/{self.kv_heads}", *rest)))
            what = "every variant" if self.variants else "causal" if self.causal else "full"
            if tuple(self.window) != (-1, -1):
                what += f" window {tuple(self.window)}"
            return f"attention {self.dtype} {dims} {what}{' +bwd' if self.backward else ''}"
        what = f"tiles {self.tiles[:3]}" if self.tiles else ("autotuned" if self.autotune else "default tiles")
        return f"matmul {self.dtype} {dims}{' (b = view.mT)' if self.b_transposed else ''} {what}"


def kv_heads_error(shapes: Iterable[tuple], kv_heads: Iterable[int]) -> str | None:
    """What is wrong with kv_heads for these (B, H, ...) shapes (a value that does not divide a shape's H), or
    None."""
    for kv in kv_heads:
        for shape in shapes:
            if kv < 0 or (kv and shape[1] % kv):
                return f"{kv} does not divide the {shape[1]} query heads of shape {'x'.join(map(str, shape))}"
    return None


def attention_jobs(dtypes: Iterable[str], head_dims: Iterable[int], causal: Iterable[bool],
                   shapes: Iterable[tuple], backward: bool = True, kv_heads: Iterable[int] = (0,),
                   windows: Iterable[tuple] = ((-1, -1),)) -> list[Job]:
    """shapes: (B, H, N) or (B, H, N_q, N_k); kv_heads: H_kv values (0: H), each a divisor of every shape's H;
    windows: flash_attention window_size values ((-1, -1): none)."""
    jobs = []
    shapes, kv_heads, windows = tuple(shapes), tuple(kv_heads), tuple(tuple(w) for w in windows)
    error = kv_heads_error(shapes, kv_heads)
    if error:
        raise ValueError(f"precompile: kv_heads {error}")
    for dtype in dtypes:
        for d in head_dims:
            for c in causal:
                for shape in shapes:
                    b, h, n_q, n_k = shape if len(shape) == 4 else (*shape, shape[-1])
                    for kv in kv_heads:
                        for w in windows:
                            jobs.append(Job("attention", dtype, (b, h, n_q, n_k, d), causal=c, backward=backward,
                                            kv_heads=0 if kv == h else kv, window=w))
    return list(dict.fromkeys(jobs))  # kv_heads H is the plain call (0)


def matmul_jobs(dtypes: Iterable[str], shapes: Iterable[tuple], autotune: bool = True,
                device: torch.device | None = None) -> list[Job]:
    """shapes: (M, K, N). With autotune, one compile-only job per tuner candidate of each shape (the same
    candidate on shapes that specialize alike is compiled once)."""
    jobs, seen = [], set()
    for dtype in dtypes:
        for m, k, n in shapes:
            if not autotune:
                jobs.append(Job("matmul", dtype, (m, k, n)))
                continue
            from .ops.runtime import matmul_candidates

            device = device or torch.device("cuda")
            for cfg in matmul_candidates(DTYPES[dtype], m, n, k, device):
                fields = tuple(asdict(cfg).values())
                # Triton specializes integers on being 1 or a multiple of 16: alike shapes share a kernel
                spec = (dtype, fields, tuple((x == 1, x % 16 == 0) for x in (m, n, k)))
                if spec not in seen:
                    seen.add(spec)
                    jobs.append(Job("matmul", dtype, (m, k, n), backward=False, tiles=fields))
    return jobs


def run_job(job: Job, device: str = "cuda") -> float:
    """Make the job's call once (compiling what it needs); returns its seconds."""
    import diyflash
    from diyflash.ops.runtime import matmul_with_tiles

    start = time.perf_counter()
    dtype = DTYPES[job.dtype]
    gen = torch.Generator().manual_seed(0)
    if job.kind == "attention" and job.variants:
        from .utils.validation import variants_call, variants_cell

        q, k, v, sinks, kw = variants_cell(device, dtype, job.shape[-1], job.shape[2], gen)
        leaves = [t.requires_grad_(job.backward) for t in (q, k, v, sinks)]
        out = variants_call(q, k, v, sinks, kw)
        if job.backward:
            torch.autograd.grad(out, leaves, torch.randn_like(out))
    elif job.kind == "attention":
        b, h, n_q, n_k, d = job.shape
        need = job.backward
        h_kv = job.kv_heads or h
        q, k, v = (torch.randn(b, heads, n, d, generator=gen).to(device, dtype).requires_grad_(need)
                   for heads, n in ((h, n_q), (h_kv, n_k), (h_kv, n_k)))
        out = diyflash.flash_attention(q, k, v, causal=job.causal, window_size=tuple(job.window))
        if need:
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    else:
        m, k, n = job.shape
        a = torch.randn(m, k, generator=gen).to(device, dtype)
        bt = torch.randn(n, k, generator=gen).to(device, dtype).mT if job.b_transposed else None
        bm = bt if bt is not None else torch.randn(k, n, generator=gen).to(device, dtype)
        if job.tiles is not None:
            matmul_with_tiles(a, bm, job.tiles)
        else:
            a.requires_grad_(job.backward)
            bm.requires_grad_(job.backward)
            c = diyflash.triton_matmul(a, bm, use_autotune=job.autotune)
            if job.backward:
                torch.autograd.grad(c, (a, bm), torch.randn_like(c))
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _fingerprint(jobs: list[Job], device: str) -> str:
    from .ops.runtime import tuning_environment

    env = tuning_environment(torch.device(device)) if device == "cuda" else {"device": device}
    env["triton_cache"] = os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache")
    text = json.dumps([env, [asdict(j) for j in jobs]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _marker(jobs: list[Job], device: str):
    from .ops.runtime import tuning_cache_dir

    return tuning_cache_dir() / f"precompiled-{_fingerprint(jobs, device)}"


def is_precompiled(jobs: list[Job], device: str = "cuda") -> bool:
    """Whether precompile already ran these jobs into the current Triton cache (a marker file that
    precompile writes when it finishes). A marker whose kernels were deleted since only costs time:
    the kernels compile again on first use."""
    return _marker(jobs, device).exists()


def precompile_jobs(jobs: list[Job], workers: int | None = None, device: str = "cuda",
                    log: Callable[[str], None] | None = print, tune: Iterable[tuple] = ()) -> float:
    """Run `jobs` in `workers` spawned processes (default: one per core, at most MAX_WORKERS, at most one
    per job; 0 runs them in this process), logging a status line per finished job with the elapsed
    time, then tune the matmul shapes in `tune` ((dtype, (M, K, N), b_transposed)) here and store the
    choices. Returns the seconds taken. Errors in a job are raised here, with the job's label."""
    start = time.perf_counter()
    say = log or (lambda _text: None)
    jobs = list(dict.fromkeys(jobs))
    if workers is None:
        workers = min(len(jobs), MAX_WORKERS, os.cpu_count() or 1)
    say(f"precompile: {len(jobs)} calls in {workers or 'this'} process{'es' if workers > 1 else ''}")
    done = 0

    def finished(job: Job, seconds: float) -> None:
        nonlocal done
        done += 1
        say(f"  [{time.perf_counter() - start:6.1f}s] {done}/{len(jobs)} {job.label()} ({seconds:.1f}s)")

    if workers == 0:
        for job in jobs:
            finished(job, run_job(job, device))
    else:
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked once initialised
        # workers only compile (and run each call once); tuning times the GPU, so it happens here, after
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(run_job, job, device): job for job in jobs}
            for fut in cf.as_completed(futures):
                job = futures[fut]
                try:
                    finished(job, fut.result())
                except Exception as e:
                    raise RuntimeError(f"precompile: {job.label()} failed: {e!r}") from e
    for dtype, (m, k, n), b_transposed in tune:
        t0 = time.perf_counter()
        run_job(Job("matmul", dtype, (m, k, n), backward=False, b_transposed=b_transposed, autotune=True), device)
        say(f"  [{time.perf_counter() - start:6.1f}s] tuned matmul {dtype} {m}x{k}x{n} ({time.perf_counter() - t0:.1f}s)")
    if device == "cuda":
        _marker(jobs, device).parent.mkdir(parents=True, exist_ok=True)
        _marker(jobs, device).touch()
    return time.perf_counter() - start


def precompile(dtypes: Iterable[str] = ("fp16", "bf16"), head_dims: Iterable[int] = (64, 128),
               causal: Iterable[bool] = (False, True), shapes: Iterable[tuple] = ((4, 16, 4096),),
               backward: bool = True, matmul_shapes: Iterable[tuple] = (), workers: int | None = None,
               device: str = "cuda", log: Callable[[str], None] | None = print, kv_heads: Iterable[int] = (0,),
               windows: Iterable[tuple] = ((-1, -1),)) -> float:
    """Fill Triton's disk cache (and the matmul tuner's) with the kernels these calls need, compiling in
    parallel worker processes, so that a later process starts warm. Returns the seconds taken.

    Args:
        dtypes: "fp16", "bf16", "fp32".
        head_dims, causal: the attention variants.
        shapes: attention shapes (B, H, N) or (B, H, N_q, N_k) the job will run: the lengths and sizes
            pick kernel variants (full or partial blocks, 32/64-bit offsets, TMA descriptors built on
            the host or per program), so give the real ones.
        backward: also compile the attention backward.
        kv_heads: the kv heads of GQA calls (0: as many as the query heads); a GQA call runs kernels of its
            own, so give the model's (e.g. (8,) for 32 query heads over 8 kv heads).
        windows: sliding windows (flash_attention's window_size, e.g. (4095, 0)); (-1, -1): none.
        matmul_shapes: (M, K, N) products to compile every tuner candidate for, then tune here.
        workers: worker processes (default one per core, at most 16); 0 compiles in this process.
        device: "cuda"; "cpu" runs the calls through Triton's interpreter (nothing to compile: for tests).
        log: where status lines go (None: nowhere).
    """
    dtypes = tuple(dtypes)
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"precompile: unknown dtype {name!r}; choose from {sorted(DTYPES)}")
    jobs = attention_jobs(dtypes, head_dims, causal, shapes, backward, kv_heads, windows)
    mm = [tuple(s) for s in matmul_shapes]
    half = [d for d in dtypes if d != "fp32"] or list(dtypes)
    if device == "cuda":
        jobs += matmul_jobs(half, mm, autotune=True)
        tune = [(d, s, False) for d in half for s in mm]
    else:
        jobs += matmul_jobs(half, mm, autotune=False)
        tune = []
    return precompile_jobs(jobs, workers, device, log, tune)


def _shape(text: str) -> tuple:
    try:
        dims = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"expected a shape like 4x16x4096, got {text!r}") from None
    if not dims or min(dims) < 1:
        raise ValueError(f"expected positive sizes, got {text!r}")
    return dims


def _window(text: str) -> tuple:
    """LEFT,RIGHT as two ints (main checks them by the ops' variant rule)."""
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"expected a window like 4095,0 (LEFT,RIGHT; -1: unbounded), got {text!r}") from None
    return left, right


def main(argv: list[str]) -> int:
    """`python -m diyflash precompile ...`"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m diyflash precompile",
                                description="Compile diyflash's kernels for given shapes into Triton's disk "
                                            "cache (and tune matmul shapes), in parallel worker processes.")
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp16", "bf16"])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", choices=["both", "true", "false"], default="both")
    p.add_argument("--shapes", nargs="+", default=["4x16x4096"],
                   help="attention shapes BxHxN or BxHxNqxNk, as the job runs them")
    p.add_argument("--kv-heads", type=int, nargs="+", default=[0],
                   help="kv heads of GQA calls, each dividing the shapes' H (default: as many as the query heads)")
    p.add_argument("--windows", nargs="+", default=["-1,-1"],
                   help="sliding windows as LEFT,RIGHT (flash_attention's window_size; default -1,-1: none)")
    p.add_argument("--forward-only", action="store_true", help="skip the attention backward")
    p.add_argument("--matmul", nargs="*", default=[], help="matmul shapes MxKxN to compile and tune")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core, <= 16)")
    args = p.parse_args(argv)
    try:
        shapes = [_shape(s) for s in args.shapes]
        mm = [_shape(s) for s in args.matmul]
        windows = [_window(w) for w in args.windows]
    except ValueError as e:
        p.error(str(e))
    from .ops.checks import head_dim_error, variant_error

    for d in args.head_dims:
        if head_dim_error(d):
            p.error(head_dim_error(d))
    for left, right in windows:
        bad = variant_error(torch.empty(0), left, right, 0.0, None, None)  # no slopes or sinks: q is not read
        if bad:
            p.error(f"--windows: {bad[1]}")
    if any(len(s) not in (3, 4) for s in shapes) or any(len(s) != 3 for s in mm):
        p.error("attention shapes are BxHxN or BxHxNqxNk, matmul shapes MxKxN")
    error = kv_heads_error(shapes, args.kv_heads)
    if error:
        p.error(f"--kv-heads {error}")
    if not torch.cuda.is_available():
        print("precompile: no GPU, nothing to compile (the interpreter runs kernels uncompiled)")
        return 0
    causal = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    seconds = precompile(args.dtypes, args.head_dims, causal, shapes, not args.forward_only, mm, args.workers,
                         kv_heads=args.kv_heads, windows=windows)
    print(f"precompile: done in {seconds:.1f}s (Triton cache: {os.environ.get('TRITON_CACHE_DIR') or '~/.triton/cache'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
