"""Probe (issue 26: the transformers backend's training step at batch 1): is bench.hf_model's step bound by
the host or by the GPU, per attn_implementation? Per step: the wall time (synced), the host's enqueue time
(step() returns once autograd has queued the backward's kernels; no sync inside), and the GPU's busy time
(CUDA events around the step). For diyflash also the host time of each attention forward (the attention
function) and backward (the autograd Function's backward), summed over the step's layers. Medians of
rounds, the implementations in turns.
    python -m bench.probes.hf_train_host [--batch 1] [--seq 4096] [--layers 4] [--rounds 7]"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import transformers
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import diyflash.integrations.transformers as dt
from bench.hf_model import llama_config
from diyflash.ops import attention as ops_attention


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cfg = llama_config(args.layers, max(8192, args.seq))
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    fwd_log, bwd_log = [], []
    attention = ALL_ATTENTION_FUNCTIONS[dt.ATTN_IMPLEMENTATION]

    def timed_forward(*a, **k):
        t = time.perf_counter()
        out = attention(*a, **k)
        fwd_log.append(time.perf_counter() - t)
        return out
    AttentionInterface.register(dt.ATTN_IMPLEMENTATION, timed_forward)
    backward = ops_attention._EagerAttention.backward

    def timed_backward(ctx, dout, dlse):
        t = time.perf_counter()
        grads = backward(ctx, dout, dlse)
        bwd_log.append(time.perf_counter() - t)
        return grads
    ops_attention._EagerAttention.backward = staticmethod(timed_backward)

    models = {}
    for impl in (dt.ATTN_IMPLEMENTATION, "sdpa"):
        torch.manual_seed(0)
        models[impl] = transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation=impl).to("cuda", torch.bfloat16)
    rows = {impl: {"wall": [], "host": [], "gpu": [], "fwd": [], "bwd": []} for impl in models}
    for r in range(args.rounds + 2):  # two warm-up rounds
        for impl, m in models.items():
            fwd_log.clear()
            bwd_log.clear()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            m.zero_grad(set_to_none=True)
            m(input_ids=ids, labels=ids).loss.backward()
            end.record()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if r < 2:
                continue
            row = rows[impl]
            row["wall"].append(t2 - t0)
            row["host"].append(t1 - t0)
            row["gpu"].append(start.elapsed_time(end) / 1e3)
            row["fwd"].append(sum(fwd_log))
            row["bwd"].append(sum(bwd_log))
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | transformers {transformers.__version__} | "
          f"Llama {args.layers} layers h2048 H16/4 bf16 | training step B{args.batch} N{args.seq} | "
          f"median of {args.rounds} rounds in turns")
    print("| impl | wall ms | host enqueue ms | GPU (events) ms | attention fwd host ms | attention bwd host ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for impl, row in rows.items():
        med = {name: statistics.median(v) * 1e3 for name, v in row.items()}
        attn = impl == dt.ATTN_IMPLEMENTATION
        print(f"| {impl} | {med['wall']:.2f} | {med['host']:.2f} | {med['gpu']:.2f} | "
              f"{med['fwd']:.2f} | {med['bwd']:.2f} |" if attn else
              f"| {impl} | {med['wall']:.2f} | {med['host']:.2f} | {med['gpu']:.2f} | - | - |")


if __name__ == "__main__":
    main()
