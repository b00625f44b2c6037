"""End to end through transformers (issue 26): a Llama-style decoder stack (hidden 2048, 16 heads, 4 kv
heads, bf16, random weights from a config) with attn_implementation "diyattention" against "sdpa" (and
"flash_attention_2" if installed): training-step time (forward + backward) and greedy generate tokens/s.
Medians of timed repeats, the implementations in turns in the same process (a, b, a, b, ...); on the
dynamic cache also one model whose decode steps alternate between the two (the pairs' ratios).
    python -m bench.hf_model [--layers 4] [--seq 4096] [--batch 2 ...] [--gen-batch 8 ...] [--prompt 4096]
                             [--new 256] [--cache dynamic static]"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

import diyflash.integrations.transformers as dt


def _timed(fn) -> float:
    """Wall-clock seconds of one call, the GPU's queue drained before and after."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def llama_config(layers: int, max_positions: int):
    """The benchmarks' model: a Llama-style decoder stack, hidden 2048, 16 heads / 4 kv heads, random
    weights (bench.hf_model and the transformers probes share it)."""
    import transformers

    return transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                    num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                                    max_position_embeddings=max_positions)


class _NeverStops:
    """The part of a stopping criterion that never stops generate: one all-False tensor a batch size."""

    no = None

    def _keep_going(self, input_ids):
        if self.no is None or self.no.shape[0] != input_ids.shape[0]:
            self.no = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return self.no


class _StepClock(_NeverStops):
    """A stopping criterion that never stops generate and notes the host's clock at each step: the gaps are the
    decode steps' times (generate waits for each step's token, so a gap is a token's whole time). The median
    gap of a generate is its steady decode speed, which a few slow stretches of a noisy host (whole
    generates ran 1.1-2.1 s on one machine) move less than the generate's wall time."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores=None, **kwargs):
        self.stamps.append(time.perf_counter())
        return self._keep_going(input_ids)

    def median_step(self) -> float:
        """The median gap between successive steps (seconds), and forget them."""
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
        self.stamps = []
        return statistics.median(gaps)


class _StepTurns(_NeverStops):
    """A stopping criterion that never stops generate and hands the decode steps to the implementations in
    turns (a, b, a, b, ...) by setting the model's config between steps (transformers reads it at each
    forward, for the attention function and for the mask): adjacent steps share the host's state of the
    moment, so a pair's ratio is free of the drift that moves whole generates (and their median steps) by
    tens of percent on a shared host. The switch itself is outside the timed gaps."""

    def __init__(self, config, impls: tuple[str, str]):
        self.config, self.impls = config, impls
        self.order = impls
        self.gaps = {impl: [] for impl in impls}
        self.turn = 0
        self.last = None

    def start(self, first: str):
        """Before a generate: its first decode step goes to implementation first (the prefill too)."""
        self.order = (first, *[i for i in self.impls if i != first])
        self.turn, self.last = 0, None
        self.config._attn_implementation = first

    def __call__(self, input_ids, scores=None, **kwargs):
        now = time.perf_counter()
        if self.last is not None:  # the step since the last call ran the turn's implementation
            self.gaps[self.order[self.turn % 2]].append(now - self.last)
            self.turn += 1
        self.config._attn_implementation = self.order[self.turn % 2]
        no = self._keep_going(input_ids)
        self.last = time.perf_counter()
        return no

    def pairs(self) -> list[tuple[float, float]]:
        """(impls[0]'s step, impls[1]'s step) of each pair of adjacent steps so far, and forget them."""
        a, b = self.gaps[self.impls[0]], self.gaps[self.impls[1]]
        out = list(zip(a, b))
        for g in self.gaps.values():
            g.clear()
        return out


def _in_turns(fns: dict, repeats: int) -> dict:
    """Seconds of each fn at each turn, timed in turns (a, b, a, b, ...): the host's speed drifts within a
    run, so a ratio is taken turn by turn (_rows). One call a turn, where bench.common.interleaved_times'
    do_bench would run a 1-2 s generate ~8 times a turn (its estimate, warm-up and timed calls)."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_timed(fn))
    return times


def _rows(task: str, times: dict, tokens: int = 0, steps: dict | None = None) -> list[dict]:
    """One row an implementation: median ms, and its speed against sdpa as the median (and the range) of
    the turns' ratios sdpa / impl; with steps (each turn's median decode step, _StepClock) the same of
    those (step_ms, step_vs_sdpa)."""
    rows = []
    for impl, t in times.items():
        ratios = [s / x for s, x in zip(times["sdpa"], t)]
        row = dict(impl=impl, task=task, ms=statistics.median(t) * 1e3, ms_turns=[x * 1e3 for x in t],
                   vs_sdpa=statistics.median(ratios), vs_sdpa_min=min(ratios), vs_sdpa_max=max(ratios))
        if tokens:
            row["tok_s"] = tokens / statistics.median(t)
        if steps:
            step_ratios = [s / x for s, x in zip(steps["sdpa"], steps[impl])]
            row.update(step_ms=statistics.median(steps[impl]) * 1e3, step_ms_turns=[x * 1e3 for x in steps[impl]],
                       step_vs_sdpa=statistics.median(step_ratios), step_vs_sdpa_min=min(step_ratios),
                       step_vs_sdpa_max=max(step_ratios))
        rows.append(row)
    return rows


def _step_turn_rows(model, prompt, prompt_mask, new: int, repeats: int, task: str) -> list[dict]:
    """Generates on one model whose decode steps alternate between diyattention and sdpa (_StepTurns), each
    generate starting with the other; a row an implementation: its median step, and its speed against sdpa as
    the median (and range) of the adjacent pairs' ratios sdpa / impl."""
    impls = (dt.ATTN_IMPLEMENTATION, "sdpa")
    turns = _StepTurns(model.config, impls)
    pairs = []
    try:
        for r in range(repeats + 1):  # the first: warm-up
            turns.start(impls[r % 2])
            with torch.no_grad():
                model.generate(prompt, attention_mask=prompt_mask, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0, stopping_criteria=[turns])
            got = turns.pairs()
            if r:
                pairs += got
    finally:
        model.config._attn_implementation = impls[0]
    ratios = sorted(b / a for a, b in pairs)
    half = int(0.98 * len(ratios) ** 0.5)  # the median's 95 % interval between order statistics (distribution-free)
    ci = [ratios[max(len(ratios) // 2 - half, 0)], ratios[min(len(ratios) // 2 + half, len(ratios) - 1)]]
    rows = []
    for i, impl in enumerate(impls):
        steps = [p[i] for p in pairs]
        mine = ratios if i == 0 else [1.0]
        rows.append(dict(impl=impl, task=task, step_ms=statistics.median(steps) * 1e3, pairs=len(pairs),
                         step_vs_sdpa=statistics.median(mine), step_vs_sdpa_min=min(mine),
                         step_vs_sdpa_max=max(mine), step_vs_sdpa_q1=mine[len(mine) // 4],
                         step_vs_sdpa_q3=mine[3 * len(mine) // 4], step_vs_sdpa_ci95=ci if i == 0 else [1.0, 1.0]))
    return rows


def main():
    import transformers

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, nargs="+", default=[2], help="training-step batch sizes")
    parser.add_argument("--gen-batch", type=int, nargs="+", default=[8], help="generate batch sizes")
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--cache", nargs="+", choices=("dynamic", "static"), default=["dynamic"],
                        help="generate's KV cache: transformers' default (dynamic) and/or cache_implementation="
                             "'static' (generate compiles the forward for it)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gen-repeats", type=int, default=None,
                        help="generate's turns (default: half of --repeats, at least one)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = llama_config(args.layers, args.prompt + args.new + args.seq)
    impls = [dt.ATTN_IMPLEMENTATION, "sdpa"]
    try:
        import flash_attn  # noqa: F401
        impls.append("flash_attention_2")
    except ImportError:
        print("# flash_attention_2: flash_attn is not installed here")
    from diyflash.kernels import _cplan

    _cplan.ready()  # (a long-running process's path: the C++ replay's build otherwise lands during the turns)
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).to("cuda", torch.bfloat16)
    state = base.state_dict()
    del base
    models = {}
    for impl in impls:
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
        m.load_state_dict(state)
        models[impl] = m.to("cuda", torch.bfloat16)
    gen_repeats = args.gen_repeats or max(1, args.repeats // 2)
    head = (f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | transformers {transformers.__version__} | "
            f"Llama {args.layers} layers h2048 H16/4 bf16 | medians of {args.repeats} (generate {gen_repeats}), the "
            "implementations in turns")
    print(head)
    rows = []
    for batch in args.batch:
        ids = torch.randint(0, cfg.vocab_size, (batch, args.seq), device="cuda")

        def step(m):
            m.zero_grad(set_to_none=True)
            m(input_ids=ids, labels=ids).loss.backward()
        fns = {impl: (lambda m=m: step(m)) for impl, m in models.items()}
        for fn in fns.values():
            fn()
        rows += _rows(f"train step B{batch} N{args.seq}", _in_turns(fns, args.repeats))
        for m in models.values():
            m.zero_grad(set_to_none=True)
    for m in models.values():
        m.eval()
    for cache in args.cache:
        for batch in args.gen_batch:
            # token 0 is the pad token below: keep it out of the prompt (generate would infer a mask with gaps
            # from it) and pass the all-ones mask a tokenizer gives an unpadded batch
            prompt = torch.randint(1, cfg.vocab_size, (batch, args.prompt), device="cuda")
            prompt_mask = torch.ones_like(prompt)
            extra = {"cache_implementation": "static"} if cache == "static" else {}

            clock = _StepClock()
            steps = {impl: [] for impl in models}

            def gen(impl, m):
                with torch.no_grad():
                    m.generate(prompt, attention_mask=prompt_mask, max_new_tokens=args.new, min_new_tokens=args.new,
                               do_sample=False, pad_token_id=0, stopping_criteria=[clock], **extra)
                steps[impl].append(clock.median_step())
            fns = {impl: (lambda impl=impl, m=m: gen(impl, m)) for impl, m in models.items()}
            for fn in fns.values():
                fn()
            for impl in steps:
                steps[impl].clear()  # (the warm-up's)
            rows += _rows(f"generate B{batch} {cache} prompt {args.prompt} +{args.new}",
                          _in_turns(fns, gen_repeats), batch * args.new, steps)
            if cache == "dynamic":
                rows += _step_turn_rows(models[dt.ATTN_IMPLEMENTATION], prompt, prompt_mask, args.new, gen_repeats,
                                        f"generate B{batch} dynamic, steps in turns")
    print(table(rows))
    if args.out:
        from bench.common import provenance

        prov = {**provenance(), "transformers": transformers.__version__}
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps({"header": head, **prov, **vars(args), **r}) + "\n")


def table(rows: list[dict]) -> str:
    """The rows (one a task and implementation) as a markdown table (also docs/integrations.md's, bench.docs)."""
    steps = any("step_ms" in r for r in rows)
    lines = ["| task | impl | ms | tok/s | speed vs sdpa, median of turns (range) |"
             + (" decode step ms | its speed vs sdpa |" if steps else ""),
             "| --- | --- | --- | --- | --- |" + (" --- | --- |" if steps else "")]
    for r in rows:
        tok = f"{r['tok_s']:.0f}" if "tok_s" in r else "-"
        line = f"| {r['task']} | {r['impl']} | - | - | - |"  # (steps in turns: no whole-run time)
        if "ms" in r:
            line = (f"| {r['task']} | {r['impl']} | {r['ms']:.1f} | {tok} | {r['vs_sdpa']:.2f}x "
                    f"({r['vs_sdpa_min']:.2f}-{r['vs_sdpa_max']:.2f}) |")
        if steps and "step_vs_sdpa_q1" in r:  # steps in turns: the pairs' quartiles (their extremes are single steps)
            ci = (f", median's 95 % {r['step_vs_sdpa_ci95'][0]:.3f}-{r['step_vs_sdpa_ci95'][1]:.3f}"
                  if "step_vs_sdpa_ci95" in r else "")
            line += (f" {r['step_ms']:.3f} | {r['step_vs_sdpa']:.3f}x (quartiles {r['step_vs_sdpa_q1']:.3f}-"
                     f"{r['step_vs_sdpa_q3']:.3f}, {r['pairs']} pairs{ci}) |")
        elif steps:
            line += (f" {r['step_ms']:.3f} | {r['step_vs_sdpa']:.3f}x ({r['step_vs_sdpa_min']:.2f}-"
                     f"{r['step_vs_sdpa_max']:.2f}) |" if "step_ms" in r else " - | - |")
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
