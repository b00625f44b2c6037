"""Probe (issue 27's scale model): NCCL's point-to-point ring shift (each rank sends to the next and receives
from the previous, as ring attention's ring_shift) and all_to_all bandwidth between the GPUs of one host, per
GPU and direction, for a 268 MB message (one 64k-token K+V shard of 8 kv heads, D128 bf16).
    python -m bench.probes.link_bandwidth [--gpus 2] [--mb 268]"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, world, port, nbytes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    send = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    recv = torch.empty_like(send)

    def shift():
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()

    def a2a():
        dist.all_to_all_single(recv, send)

    for name, fn in (("ring shift (send + recv)", shift), ("all_to_all", a2a)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        end.record()
        torch.cuda.synchronize()
        sec = start.elapsed_time(end) / 1e3 / 10
        moved = nbytes if name.startswith("ring") else nbytes * (world - 1) / world
        if rank == 0:
            print(f"{name}: {nbytes / 1e6:.0f} MB a rank, {sec * 1e3:.2f} ms, {moved / sec / 1e9:.0f} GB/s per GPU and direction")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--mb", type=int, default=268)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"# {torch.cuda.get_device_name()} x {args.gpus} | torch {torch.__version__} | NCCL")
    mp.spawn(_worker, args=(args.gpus, port, args.mb * 10**6), nprocs=args.gpus)


if __name__ == "__main__":
    main()
