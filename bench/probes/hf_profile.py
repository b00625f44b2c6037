"""Probe (issue 26: why the transformers backend is not faster than sdpa): torch.profiler over one
training step of bench.hf_model's Llama stack (2 layers, B2 N4096, bf16) per attn_implementation; prints
the top CUDA kernels by total time and the step's CPU and CUDA totals.
    python -m bench.probes.hf_profile [--batch 2] [--seq 4096] [--layers 2]"""

from __future__ import annotations

import argparse
import copy

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

import diyflash.integrations.transformers as dt
from bench.hf_model import llama_config


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    cfg = llama_config(args.layers, max(8192, args.seq))
    ids = torch.randint(0, 32000, (args.batch, args.seq), device="cuda")
    for impl in (dt.ATTN_IMPLEMENTATION, "sdpa"):
        torch.manual_seed(0)
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
        m = m.to("cuda", torch.bfloat16)

        def step():
            m.zero_grad(set_to_none=True)
            m(input_ids=ids, labels=ids).loss.backward()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        print(f"#### {impl}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
        del m
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
