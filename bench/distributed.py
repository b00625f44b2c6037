"""Context-parallel attention on several GPUs (issue 27): diyflash.distributed's ring and Ulysses attention
(and on 4 GPUs hybrid_attention on a 2 x 2 mesh), forward + backward, against single-GPU diyflash, per-GPU
TFLOPS. B1 H32 H_kv 8 D128 bf16 causal, zigzag shards (--layout), or a sliding window of --window keys
(counting only the FLOPs of visible keys). One process per GPU (NCCL, torch.multiprocessing spawn); "ring,
sends off" runs the same ring with its K/V sends replaced by local copies and its dk/dv exchanges by zero
fills (wrong results, the same compute): the ring's time minus that one is the communication its
computation did not hide. Times are the slowest rank's median of --reps, with a barrier before each; the
single-GPU row runs the whole sequence on GPU 0 afterwards (or --single-n tokens).
    python -m bench.distributed [--n 131072 262144] [--gpus 2] [--reps 3] [--window 4096] [--layout contiguous]
        [--out results.jsonl]"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

B, H, H_KV, D = 1, 32, 8, 128


def flops(n: int, window: int = -1) -> float:
    """Forward + backward (2.5x the forward) FLOPs of the causal attention: half the score matrix, or with a
    window of w keys to the left, the visible keys only (row i sees min(i, w) + 1 of them)."""
    if window < 0 or window >= n:
        return 4 * B * H * n * n * D / 2 * 3.5
    visible = n + window * (window - 1) // 2 + (n - window) * window
    return 4 * B * H * visible * D * 3.5


def _time(fn, reps: int, barrier: bool) -> float:
    """Median seconds of fn() over reps (one warm-up), a barrier before each when distributed."""
    times = []
    for i in range(reps + 1):
        if barrier:
            dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _fwd_bwd(attn, q, k, v, g, **kw):
    return lambda: torch.autograd.grad(attn(q, k, v, True, **kw), (q, k, v), g)


def _zero_fills(send, recv, group, distance):
    """layout.exchange without the network: the receive buffers zeroed, no request."""
    for b in recv:
        b.zero_()
    return []


def _worker(rank, world, port, ns, reps, queue, window, layout):
    import diyflash.distributed as dd
    import diyflash.distributed.ring as ring_mod

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    mesh = None
    if world == 4:  # hybrid_attention: Ulysses over pairs of GPUs, the ring across the pairs
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("ring", "ulysses"))
    try:
        for n in ns:
            gen = torch.Generator(device="cuda").manual_seed(rank)
            q, k, v, g = (torch.randn(B, heads, n // world, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                          for heads in (H, H_KV, H_KV, H))
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            row = {}
            kw = dict(window_size=(window, 0), layout=layout)
            row["ring"] = _time(_fwd_bwd(dd.ring_attention, q, k, v, g, **kw), reps, True)
            shift, exchange = ring_mod.ring_shift, ring_mod.exchange
            ring_mod.ring_shift = lambda ts, group, distance=1: ([t.clone() for t in ts], [])
            ring_mod.exchange = _zero_fills
            try:
                row["ring, sends off"] = _time(_fwd_bwd(dd.ring_attention, q, k, v, g, **kw), reps, True)
            finally:
                ring_mod.ring_shift, ring_mod.exchange = shift, exchange
            row["ulysses"] = _time(_fwd_bwd(dd.ulysses_attention, q, k, v, g, **kw), reps, True)
            if mesh is not None:
                row["hybrid 2x2"] = _time(_fwd_bwd(dd.hybrid_attention, q, k, v, g, mesh=mesh, **kw), reps, True)
            slowest = torch.tensor([row[name] for name in row], device="cuda", dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0:
                queue.put((n, dict(zip(row, slowest.tolist()))))
            del q, k, v, g
            torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, nargs="+", default=[131072, 262144])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--single-n", type=int, nargs="*", default=None,
                        help="single-GPU lengths (default: the same as --n)")
    parser.add_argument("--window", type=int, default=-1, help="a sliding window of this many keys to the left")
    parser.add_argument("--layout", default="zigzag", choices=("zigzag", "contiguous"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import diyflash

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(args.gpus, port, args.n, args.reps, queue, args.window, args.layout),
                       nprocs=args.gpus, start_method="spawn")
    results = dict(queue.get() for _ in args.n)
    single = {}
    for n in (args.n if args.single_n is None else args.single_n):
        q, k, v, g = (torch.randn(B, heads, n, D, device="cuda", dtype=torch.bfloat16) for heads in (H, H_KV, H_KV, H))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        single[n] = _time(_fwd_bwd(diyflash.flash_attention, q, k, v, g, window_size=(args.window, 0)), args.reps,
                          False)
        del q, k, v, g
        torch.cuda.empty_cache()
    nccl = torch.cuda.nccl.version()
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    head = (f"# {torch.cuda.get_device_name()} x {args.gpus} | torch {torch.__version__} | NCCL {nccl} | "
            f"B{B} H{H}/{H_KV} D{D} bf16 causal{f', window {args.window}' if args.window >= 0 else ''}, "
            f"{args.layout}, fwd + bwd | median of {args.reps}, slowest rank")
    print(head)
    print("| N | provider | ms | TFLOPS per GPU | vs single GPU | exposed communication (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = []
    for n in sorted(set(results) | set(single)):
        ref = flops(n, args.window) / single[n] / 1e12 if n in single else None
        if n in single:
            rows.append(dict(n=n, provider="diyflash, 1 GPU", ms=single[n] * 1e3, tflops_per_gpu=ref))
        for name, t in results.get(n, {}).items():
            tf = flops(n, args.window) / args.gpus / t / 1e12
            exposed = (t - results[n]["ring, sends off"]) * 1e3 if name == "ring" else None
            rows.append(dict(n=n, provider=f"{name}, {args.gpus} GPUs", ms=t * 1e3, tflops_per_gpu=tf,
                             vs_single=tf / ref if ref else None, exposed_ms=exposed))
    for r in rows:
        vs = f"{r['vs_single']:.2f}x" if r.get("vs_single") else "-"
        ex = f"{r['exposed_ms']:.1f}" if r.get("exposed_ms") is not None else "-"
        print(f"| {r['n']} | {r['provider']} | {r['ms']:.1f} | {r['tflops_per_gpu']:.0f} | {vs} | {ex} |")
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps({"header": head, **r}) + "\n")


if __name__ == "__main__":
    main()
