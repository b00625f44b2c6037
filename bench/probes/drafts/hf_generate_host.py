"""Probe (issue 47; the probe of 0267dd4^ with --profile now timing every implementation's whole generate under cProfile, written to --dump) (issue 26: generate at batch 1 is slower with diyflash than with sdpa): where a greedy decode
step's time goes in bench.hf_model's Llama stack (4 layers, h2048, 16 / 4 heads, bf16, a 4k prompt). A
batch-1 step of this model is bound by the host (the GPU needs ~0.2 ms of its ~5 ms), so the time each
attention call takes on the host (perf_counter around the attention function, no sync) is what it adds to
a token. --left-pad N pads row b of the batch by b * N tokens on the left (a tokenizer's padded batch,
whose decode steps run as packed sequences). Prints, per attn_implementation and batch: tokens/s, ms a
token, and the attention calls' host us a call and ms a token; the rest of the step is the model outside
attention, the same code for both.
--cache static: transformers' static cache (which generate compiles the forward for, on CUDA).
    python -m bench.probes.hf_generate_host [--batches 1 8] [--prompt 4096] [--new 128] [--left-pad 0] [--cache static]
                                            [--profile 30]"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import statistics
import time

import torch
import transformers
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import diyflash.integrations.transformers as dt
from bench.hf_model import llama_config
import io


def _timed_attention(fn, log: list, profiler: dict):
    def timed(*args, **kwargs):
        prof = profiler.get("on")
        if prof is not None:
            prof.enable()
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        log.append(time.perf_counter() - t)
        if prof is not None:
            prof.disable()
        return out
    return timed


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="ROWS",
                        help="then cProfile diyflash's attention calls inside one more generate per batch (ROWS rows)")
    parser.add_argument("--dump", default=".")
    parser.add_argument("--left-pad", type=int, default=0,
                        help="row b of the batch is left-padded by b * LEFT_PAD tokens (a tokenizer's padded batch)")
    parser.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                        help="static: cache_implementation='static' (generate compiles the forward where it can); "
                             "the attention calls are then not timed one by one")
    args = parser.parse_args()
    static = args.cache == "static"
    cfg = llama_config(4, args.prompt + args.new)
    torch.manual_seed(0)
    logs = {}
    models = {}
    profiler = {}
    for impl in (dt.ATTN_IMPLEMENTATION, "sdpa"):  # each name's function, wrapped in a host timer
        logs[impl] = []
        if not static:
            AttentionInterface.register(impl, _timed_attention(ALL_ATTENTION_FUNCTIONS[impl], logs[impl],
                                                                profiler if impl == dt.ATTN_IMPLEMENTATION else {}))
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
        models[impl] = m.to("cuda", torch.bfloat16).eval()
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | transformers {transformers.__version__} | "
          f"Llama 4 layers h2048 H16/4 bf16 | prompt {args.prompt} + {args.new} greedy | left padding {args.left_pad} x row | "
          f"{args.cache} cache | "
          f"median of {args.repeats} in turns")
    profiles = []
    print("| impl | batch | tok/s | ms a token | attention host us a call (decode) | attention host ms a token |")
    print("| --- | --- | --- | --- | --- | --- |")
    for batch in args.batches:
        prompt = torch.randint(1, cfg.vocab_size, (batch, args.prompt), device="cuda")
        mask = torch.ones_like(prompt)
        for row in range(batch):  # pad token 0 on the left, masked out
            prompt[row, :row * args.left_pad] = 0
            mask[row, :row * args.left_pad] = 0
        times = {impl: [] for impl in models}
        per_call = {impl: [] for impl in models}

        def gen(m):
            return m.generate(prompt, attention_mask=mask, max_new_tokens=args.new,
                              min_new_tokens=args.new, do_sample=False, pad_token_id=0,
                              **({"cache_implementation": "static"} if static else {}))
        with torch.no_grad():
            for m in models.values():
                gen(m)
            for _ in range(args.repeats):  # the implementations in turns: host noise drifts within a run
                for impl, m in models.items():
                    logs[impl].clear()
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    gen(m)
                    torch.cuda.synchronize()
                    times[impl].append(time.perf_counter() - t)
                    per_call[impl].append(statistics.median(logs[impl][cfg.num_hidden_layers:] or [float("nan")]))
        for impl in models:  # per call: after prefill
            t, call = statistics.median(times[impl]), statistics.median(per_call[impl])
            print(f"| {impl} | {batch} | {batch * args.new / t:.0f} | {t / args.new * 1e3:.2f} | {call * 1e6:.0f} | "
                  f"{call * cfg.num_hidden_layers * 1e3:.2f} |")
        if args.profile:
            for impl, m in models.items():  # the whole generate under cProfile, each implementation
                prof = cProfile.Profile()
                with torch.no_grad():
                    prof.enable(); gen(m); prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile)
                buf2 = io.StringIO()
                pstats.Stats(prof, stream=buf2).sort_stats("cumulative").print_stats(args.profile)
                open(f"{args.dump}/prof_{impl}_b{batch}.txt", "w").write(buf.getvalue() + "\n\n" + buf2.getvalue())
                st = pstats.Stats(prof)
                total = sum(v[2] for v in st.stats.values())
                print(f"## {impl} B{batch}: whole generate under cProfile, {total:.3f} s of own time")


def _profiled(run, profiler: dict) -> cProfile.Profile:
    profiler["on"] = prof = cProfile.Profile()
    try:
        with torch.no_grad():
            run()
    finally:
        profiler.pop("on")
    return prof


if __name__ == "__main__":
    main()
