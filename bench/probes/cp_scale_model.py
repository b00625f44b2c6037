"""A MODEL, not a measurement (issue 27): per-GPU efficiency of context-parallel attention at W GPUs and N
tokens, from quantities measured on the 2-GPU H200 machine (2026-11-24, bench/results/distributed_h200x2.txt):
- R, per-GPU attention throughput of the chunk-pair calls: 412 TFLOPS (ring with its sends off, N 256k, W 2);
- the NVLink ring shift (send + recv) at 289 GB/s and all_to_all at 277 GB/s per GPU and direction
  (bench.probes.link_bandwidth);
and one assumption: across nodes, 50 GB/s per GPU (one 400 Gb/s NIC per GPU; not measured here).
B1 H32 H_kv 8 D128 bf16 causal, fwd + bwd (3.5x the forward's FLOPs), the zigzag layout (equal work a rank).
Ring (as diyflash implements it): each of W steps a rank attends to one kv shard while the next travels (hidden
while the step's compute is longer); in the backward a rank keeps its own shard's dk/dv at home, and the fp32
accumulators of the others' gradients travel with each shard while the next step computes (hidden while that
step's backward is longer), the last hop back to the owner exposed. Ulysses: all_to_alls of q, k, v, out
(forward) and dout, dq, dk, dv (backward), not overlapped; needs H divisible by W. Hybrid (hybrid_attention):
Ulysses over the G GPUs of a node, the ring over W / G nodes. Smaller chunks run the kernels below R (single GPU: ~0.9x at 8k-token
chunks); the model keeps R. The exposed time is what efficiency loses: E = compute / (compute + exposed).
    python -m bench.probes.cp_scale_model"""

from __future__ import annotations

B, H, H_KV, D, BYTES = 1, 32, 8, 128, 2
R = 412e12  # FLOP/s per GPU, measured
NVLINK = 289e9  # B/s per GPU and direction, ring shift, measured
A2A_NVLINK = 277e9  # all_to_all, measured
INTER = 50e9  # B/s per GPU across nodes: an assumption
NODE = 8  # GPUs a node


def fwd_flops(n):
    return 4 * B * H * n * n * D / 2


def _ring_exposed(steps, compute_fwd_step, kv_bytes, dkv_bytes, bw):
    """Exposed seconds of a ring of `steps` steps: a kv shift longer than the step's compute shows (forward
    and backward, the backward computing 2.5x); the foreign dk/dv accumulators travel steps - 1 hops, of which
    all but the last (back to the owner, shown whole) overlap the next step's backward."""
    kv, dkv = kv_bytes / bw, dkv_bytes / bw
    if steps < 2:
        return 0.0
    return ((steps - 1) * (max(0.0, kv - compute_fwd_step) + max(0.0, kv - 2.5 * compute_fwd_step))
            + (steps - 2) * max(0.0, dkv - 2.5 * compute_fwd_step) + dkv)


def ring(n, w, node=NODE):
    """(compute s, exposed s) a GPU: a ring over all w GPUs (over nodes it waits on its inter-node hops)."""
    bw = NVLINK if w <= node else INTER
    shard = B * H_KV * (n // w) * D  # k (or v) elements a rank holds
    step = fwd_flops(n) / w / w / R
    return 3.5 * fwd_flops(n) / w / R, _ring_exposed(w, step, 2 * shard * BYTES, 2 * shard * 4, bw)


def _a2a_seconds(nbytes, w, node):
    if w <= node:
        return nbytes / A2A_NVLINK
    return max(nbytes * (node - 1) / (w - 1) / A2A_NVLINK, nbytes * (w - node) / (w - 1) / INTER)


def ulysses(n, w, node=NODE):
    """(compute s, exposed s) a GPU; None where H does not divide by w."""
    if H % w:
        return None
    frac = (w - 1) / w  # the share of a rank's data that leaves it
    nbytes = (n // w) * D * BYTES * ((H + 2 * H_KV + H) + (H + H + 2 * H_KV)) * frac  # fwd q, k, v, out; bwd
    return 3.5 * fwd_flops(n) / w / R, _a2a_seconds(nbytes, w, node)


def hybrid(n, w, node=NODE):
    """Ulysses over the `node` GPUs of a node (H / node heads a GPU), a ring over the w / node nodes."""
    if w <= node or H % node:
        return None
    nodes = w // node
    shard = B * (H_KV / node) * (n // nodes) * D  # a GPU's kv heads over its node's share of the sequence
    step = fwd_flops(n) / w / nodes / R
    ring_exposed = _ring_exposed(nodes, step, 2 * shard * BYTES, 2 * shard * 4, INTER)
    frac = (node - 1) / node
    a2a = (n // w) * D * BYTES * ((H + 2 * H_KV + H) + (H + H + 2 * H_KV)) * frac / A2A_NVLINK
    return 3.5 * fwd_flops(n) / w / R, ring_exposed + a2a


def main():
    print(__doc__.split("\n    python")[0])
    print()
    print("| GPUs | N | ring | Ulysses | hybrid (Ulysses in a node, ring over nodes) |")
    print("| --- | --- | --- | --- | --- |")
    for w, n in ((2, 131072), (2, 262144), (8, 262144), (8, 1 << 20), (64, 1 << 20)):
        cells = []
        for model in (ring, ulysses, hybrid):
            got = model(n, w)
            cells.append("-" if got is None else f"{got[0] / (got[0] + got[1]):.1%}")
        print(f"| {w} | {n // 1024}k | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
