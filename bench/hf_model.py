"""End to end through transformers (issue 26): a Llama-style decoder stack (hidden 2048, 16 heads, 4 kv
heads, bf16, random weights from a config) with attn_implementation "diyattention" against "sdpa" (and
"flash_attention_2" if installed): training-step time (forward + backward) and greedy generate tokens/s.
Medians of timed repeats, the providers in turns in the same process.
    python -m bench.hf_model [--layers 4] [--seq 4096] [--batch 2] [--gen-batch 8] [--prompt 4096] [--new 256]"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

import diyflash.integrations.transformers as dt


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def llama_config(layers: int, max_positions: int):
    """The benchmarks' model: a Llama-style decoder stack, hidden 2048, 16 heads / 4 kv heads, random
    weights (bench.hf_model and the transformers probes share it)."""
    import transformers

    return transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                    num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                                    max_position_embeddings=max_positions)


def main():
    import transformers

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--gen-batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = llama_config(args.layers, args.prompt + args.new + args.seq)
    impls = [dt.ATTN_IMPLEMENTATION, "sdpa"]
    try:
        import flash_attn  # noqa: F401
        impls.append("flash_attention_2")
    except ImportError:
        print("# flash_attention_2: flash_attn is not installed here")
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).to("cuda", torch.bfloat16)
    state = base.state_dict()
    models = {}
    for impl in impls:
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
        m.load_state_dict(state)
        models[impl] = m.to("cuda", torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    # token 0 is the pad token below: keep it out of the prompt (generate would infer a mask with gaps from it)
    # and pass the all-ones mask a tokenizer gives an unpadded batch
    prompt = torch.randint(1, cfg.vocab_size, (args.gen_batch, args.prompt), device="cuda")
    prompt_mask = torch.ones_like(prompt)
    head = (f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | transformers {transformers.__version__} | "
            f"Llama {args.layers} layers h2048 H16/4 bf16")
    print(head)
    rows = []
    for impl, m in models.items():
        def step(m=m):
            m.zero_grad(set_to_none=True)
            m(input_ids=ids, labels=ids).loss.backward()
        step()
        t_step = _timed(step, args.repeats)
        m.eval()
        with torch.no_grad():
            gen = lambda m=m: m.generate(prompt, attention_mask=prompt_mask, max_new_tokens=args.new,  # noqa: E731
                                         min_new_tokens=args.new, do_sample=False, pad_token_id=0)
            gen()
            t_gen = _timed(gen, max(1, args.repeats // 2))
        m.train()
        rows.append(dict(impl=impl, step_ms=t_step * 1e3, gen_tok_s=args.gen_batch * args.new / t_gen))
    ref = next(r for r in rows if r["impl"] == "sdpa")
    print(f"| impl | train step B{args.batch} N{args.seq} (ms) | vs sdpa | generate B{args.gen_batch} "
          f"prompt {args.prompt} +{args.new} (tok/s) | vs sdpa |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['impl']} | {r['step_ms']:.1f} | {ref['step_ms'] / r['step_ms']:.2f}x | {r['gen_tok_s']:.0f} | "
              f"{r['gen_tok_s'] / ref['gen_tok_s']:.2f}x |")
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps({"header": head, **vars(args), **r}) + "\n")


if __name__ == "__main__":
    main()
