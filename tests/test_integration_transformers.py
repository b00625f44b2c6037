"""diyflash as a transformers attention backend (issue 26): tiny random-weight models built from configs
(no download) against attn_implementation="sdpa" (or "eager" where sdpa lacks the feature) under the 2x
rule, with a float64 copy of the model as the oracle: logits and every parameter gradient of a training
step, greedy generation with right- and left-padded batches (identical tokens), packed rows, compile.
The same file runs on CPU (interpreter) and on CUDA."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers extra: pip install 'diyflash[transformers]'")

import diyflash  # noqa: E402
import diyflash.integrations.transformers as dt  # noqa: E402
from diyflash.utils.validation import error_report  # noqa: E402
from helpers import ON_GPU  # noqa: E402

VOCAB = 128


def _config(kind, head_dim=16):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=512, attention_dropout=0.0)
    if kind == "llama":  # GQA 4/2
        return transformers.LlamaConfig(**common), "sdpa"
    if kind == "mistral":  # sliding window on every layer
        return transformers.MistralConfig(**common, sliding_window=8), "sdpa"
    if kind == "gemma2":  # softcap + alternating windows; sdpa refuses softcap: eager is the peer
        return transformers.Gemma2Config(**common, sliding_window=8, attn_logit_softcapping=5.0,
                                         final_logit_softcapping=None, query_pre_attn_scalar=head_dim), "eager"
    if kind == "gpt_oss":  # sinks (s_aux) + alternating windows; no sdpa sinks: eager
        if not hasattr(transformers, "GptOssConfig"):
            pytest.skip(f"transformers {transformers.__version__} has no gpt-oss")
        return transformers.GptOssConfig(**common, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
                                         layer_types=["sliding_attention", "full_attention"]), "eager"
    raise ValueError(kind)


def _models(kind, device, head_dim=16, dtype=torch.float32):
    """(ours, the peer, a float64 eager oracle) with the same weights; ours and the peer in dtype."""
    cfg, peer = _config(kind, head_dim)
    # gpt-oss's experts: the plain loop (grouped_mm has no float64 for the oracle)
    extra = {"experts_implementation": "eager"} if kind == "gpt_oss" else {}
    torch.manual_seed(0)
    # each model its own config: from_config records the implementation in the config object it is given
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=dt.ATTN_IMPLEMENTATION,
                                                         **extra)
    if kind == "gpt_oss":  # sinks start at 0 in a fresh model: make them matter
        with torch.no_grad():
            for layer in ours.model.layers:
                layer.self_attn.sinks.normal_()
    plain = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=peer, **extra)
    plain.load_state_dict(ours.state_dict())
    oracle = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager",
                                                           **extra).double()
    oracle.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == dt.ATTN_IMPLEMENTATION
    return ours.to(device, dtype), plain.to(device, dtype), oracle.to(device)


def _batch(device, length=24, pad_side=None):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, length), generator=gen)
    mask = torch.ones(2, length, dtype=torch.long)
    if pad_side == "left":
        mask[1, :7] = 0
    elif pad_side == "right":
        mask[1, -7:] = 0
    return ids.to(device), mask.to(device)


def _step(model, ids, mask):
    model.train()
    model.zero_grad()
    labels = ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _steps(models, ids, mask, rows=None):
    """_step of (ours, peer, oracle), and the error report of the logits at `rows` (default: every row;
    the valid tokens' only where pad rows see no key, which transformers' eager path fills with garbage)."""
    results = [_step(m, ids, mask) for m in models]
    (got, _), (base, _), (want, _) = results
    rows = torch.ones_like(mask, dtype=torch.bool) if rows is None else rows
    return results, error_report("logits", got[rows], want[rows], base[rows])


@pytest.mark.parametrize("pad_side", [None, "right"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_training_step_meets_the_error_rule(device, kind, pad_side):
    """Logits (every row, the pad rows of right padding included: they see the last kept keys in their
    window) and every parameter gradient of a step with a masked loss. (Left padding is for generation: in
    training, transformers' own eager and sdpa paths give NaN there, its fully masked pad rows' NaN values
    reaching valid rows through p = 0 times v = NaN; ours outputs 0 for them.)"""
    ids, mask = _batch(device, pad_side=pad_side)
    ((_, got_g), (_, base_g), (_, want_g)), report = _steps(_models(kind, device), ids, mask)
    assert report.ok, str(report)
    assert set(got_g) == set(want_g)
    for name in want_g:
        report = error_report(name, got_g[name], want_g[name], base_g[name])
        assert report.ok, str(report)


@pytest.mark.parametrize("pad_side", [None, "left", "right"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_greedy_generation_gives_the_same_tokens(device, kind, pad_side):
    """8 greedy tokens after a prompt, unpadded, left- or right-padded (prefill, then decode steps against
    the KV cache). Right padding: generate reads a pad row's logits (it sees the last kept keys in its
    window), then decodes over a mask with a gap (the padding between the prompt and the new tokens), where
    the window counts the gap's positions as sdpa's mask does."""
    ours, plain, _ = _models(kind, device)
    ids, mask = _batch(device, length=16, pad_side=pad_side)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.eval().generate(ids, **kw), plain.eval().generate(ids, **kw))


@pytest.mark.parametrize("pad_side", [None, "left"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_generation_with_a_static_cache(device, kind, pad_side):
    """cache_implementation="static" (what compiled generation uses; the sliding layers' static window
    fills up here): the keys are the whole preallocated buffer. With padding the 2-D mask covers the
    tokens seen so far (the empty slots past it are left out); without, mask_function counts the filled
    keys. Before, padding raised a shape error and no padding gave other tokens than sdpa."""
    ours, plain, _ = _models(kind, device)
    ids, mask = _batch(device, length=16, pad_side=pad_side)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        assert torch.equal(ours.eval().generate(ids, **kw), plain.eval().generate(ids, **kw))


@pytest.mark.skipif(not ON_GPU, reason="generate compiles a static cache's forward with CUDA graphs on a GPU only")
@pytest.mark.parametrize("pad_side", [None, "left"])
def test_static_cache_generate_with_split_kv(device, monkeypatch, pad_side, fresh_caches):
    """The static cache's compiled generate (CUDA-graph trees, mode="reduce-overhead") with every KV-cache
    call split over 4 key ranges, as long prompts are: the tokens equal sdpa's. Split-KV's scratch kept
    between calls made the graphs' warmup refuse ("tensor(s) in the cudagraph pool not tracked as
    outputs") before the fix; the test above is too short to split."""
    from diyflash.kernels.attention import kvcache as kv

    calls = []
    monkeypatch.setattr(kv, "splits_within", lambda *args, **kw: calls.append(args) or 4)
    diyflash.clear_caches()  # a kept buffer already big enough would hide an allocation
    ours, plain, _ = _models("llama", device)
    ids, mask = _batch(device, length=16, pad_side=pad_side)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        assert torch.equal(ours.eval().generate(ids, **kw), plain.eval().generate(ids, **kw))
    assert calls  # the KV-cache kernel ran, split


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_left_padded_decode_steps_read_the_cache_in_place(device, monkeypatch, cache):
    """A left-padded batch: every decode step attends through flash_attention_with_kvcache with each row's
    first key as cache_leftpad. On a static cache what attention gets in place of the mask has one shape at
    every step (the 2-D mask grew a column a step: a compiled decode step recompiled for every length before
    cache_leftpad); on a dynamic one the kernel reads the cache in place (packed sequences gathered a copy of
    every key a layer a step)."""
    ours, plain, _ = _models("llama", device)
    ids, mask = _batch(device, length=16, pad_side="left")
    seen = []
    real = dt.flash_attention_with_kvcache

    def spy(q, k_cache, v_cache, seqlens, *args, cache_leftpad=None, **kw):
        seen.append((q.shape[2], tuple(seqlens.shape), None if cache_leftpad is None else cache_leftpad.tolist()))
        return real(q, k_cache, v_cache, seqlens, *args, cache_leftpad=cache_leftpad, **kw)

    monkeypatch.setattr(dt, "flash_attention_with_kvcache", spy)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        assert torch.equal(ours.eval().generate(ids, **kw), plain.eval().generate(ids, **kw))
    layers = ours.config.num_hidden_layers
    # a static cache's 16-row prefill is a short step against a longer buffer too (SPAN_ROWS); a dynamic
    # cache's prefill, all of its keys, keeps the mask
    prefill = [16] * layers if cache == "static" else []
    assert [q_len for q_len, _, _ in seen] == prefill + [1] * 5 * layers  # then the 5 decode steps
    assert all(shape == (2,) and starts == [0, 7] for _, shape, starts in seen)


def test_mask_function_gives_a_static_cache_spans():
    """mask_function on a static cache (q_offset is its tensor): no padding -> the key counts (B,); left
    padding -> ends then starts (2B,); right padding or a gap -> the mask itself. Another cache: the spans
    for a left-padded decode step without grad; the mask for a prefill, or with grad."""
    offset = torch.tensor(5)

    def spans(rows, q_offset=offset):
        mask = torch.tensor(rows, dtype=torch.bool)
        return dt.mask_function(len(rows), 1, 16, q_offset, 0, attention_mask=mask)

    assert spans([[1] * 6, [1] * 6]).tolist() == [6, 6]
    assert spans([[1] * 6, [0, 0] + [1] * 4]).tolist() == [6, 6, 0, 2]
    assert spans([[0] * 6, [0] + [1] * 5]).tolist() == [6, 6, 6, 1]  # a row of pad slots only: no key
    for rows in ([[1] * 6, [1] * 4 + [0, 0]], [[1, 1, 0, 1, 1, 1], [1] * 6]):
        assert spans(rows).dim() == 2
    left = torch.tensor([[1] * 6, [0, 0] + [1] * 4], dtype=torch.bool)
    with torch.no_grad():
        assert dt.mask_function(2, 1, 6, 5, 0, attention_mask=left).tolist() == [6, 6, 0, 2]  # a decode step
        assert dt.mask_function(2, 6, 6, 0, 0, attention_mask=left).dim() == 2  # a prefill
    with torch.enable_grad():
        assert dt.mask_function(2, 1, 6, 5, 0, attention_mask=left).dim() == 2
    given = torch.tensor([6, 6, 0, 2], dtype=torch.int32)
    assert dt.mask_function(2, 1, 16, offset, 0, attention_mask=given) is given


class _Layer(torch.nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.is_causal = causal


_MASKS = {  # (B=3, S=20) padding masks
    "none": [[1] * 20] * 3,
    "right": [[1] * 20, [1] * 13 + [0] * 7, [1] * 19 + [0]],
    "left": [[1] * 20, [0] * 7 + [1] * 13, [0] + [1] * 19],
    "gap": [[1] * 20, [1] * 9 + [0] * 5 + [1] * 6, [1] * 4 + [0] + [1] * 15],  # right padding, then new tokens
    "gaps": [[0, 1, 0, 0, 1, 1, 0, 1] + [1, 0] * 6, [1] * 17 + [0, 1, 0], [0] * 3 + [1] * 17],  # pad tokens inside
    "empty row": [[1] * 20, [0] * 20, [1] * 12 + [0] * 8],
}


def _masked_reference(q, k, v, mask, causal, window):
    """What transformers' sdpa path computes (float64 here, or plain PyTorch in q's dtype): the query rows are
    the last L of the S positions; the row at position p sees key j iff mask[b, j], j <= p (causal) and
    p - window < j (and j < p + window when not causal). A row that sees nothing is 0."""
    length, keys = q.shape[2], k.shape[2]
    p = torch.arange(keys - length, keys, device=q.device)[:, None]
    j = torch.arange(keys, device=q.device)[None]
    allowed = mask.bool()[:, None, None, :] & (j <= p if causal else torch.ones_like(j <= p))
    if window is not None:
        allowed = allowed & (j > p - window) & (causal or (j < p + window))
    rep = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=allowed)
    return out.transpose(1, 2)


@pytest.mark.parametrize("window", [None, 4, 8])
@pytest.mark.parametrize("len_q", [20, 3, 1])
@pytest.mark.parametrize("pattern", list(_MASKS))
def test_padding_masks_give_sdpa_rows(device, pattern, len_q, window):
    """Every query row (pad rows included) as transformers' sdpa path computes it, for right, left and no
    padding, a row of padding only, a gap (a right-padded prompt followed by new tokens) and pad tokens
    inside prompts (their rows see the kept keys before them), prefill (20 rows), a chunk of 3 and a decode
    step, with and without a sliding window; under the 2x rule against the float64 reference. Several rows
    over a gap with a window raise."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, h, n, 16, generator=gen).to(device) for h, n in ((4, len_q), (2, 20), (2, 20)))
    mask = torch.tensor(_MASKS[pattern], device=device)
    call = lambda: dt.attention_forward(_Layer(True), q, k, v, mask, sliding_window=window)[0]  # noqa: E731
    if pattern in ("gap", "gaps") and len_q > 1 and window is not None:
        with pytest.raises(NotImplementedError, match="sliding window"):
            call()
        return
    got = call()
    want = _masked_reference(q.double(), k.double(), v.double(), mask, True, window)
    report = error_report("out", got, want, _masked_reference(q, k, v, mask, True, window))
    assert report.ok, str(report)


def test_padding_mask_of_many_gaps_raises(device):
    """Every other token a pad: the gap rows would need ~L^2 / 8 key copies (more than 4 per kept key)."""
    q, k = torch.zeros(1, 4, 300, 16, device=device), torch.zeros(1, 2, 300, 16, device=device)
    mask = (torch.arange(300, device=device) % 2 == 0).unsqueeze(0)
    with pytest.raises(NotImplementedError, match="many gaps"):
        dt.attention_forward(_Layer(True), q, k, k, mask)


def test_padding_masks_without_causal_masking(device):
    """A bidirectional layer: every row (pad rows too) sees every kept key; a window there raises."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(3, h, 20, 16, generator=gen).to(device) for h in (4, 2, 2))
    mask = torch.tensor(_MASKS["right"], device=device)
    got = dt.attention_forward(_Layer(False), q, k, v, mask)[0]
    want = _masked_reference(q.double(), k.double(), v.double(), mask, False, None)
    report = error_report("out", got, want, _masked_reference(q, k, v, mask, False, None))
    assert report.ok, str(report)
    with pytest.raises(NotImplementedError, match="without causal masking"):
        dt.attention_forward(_Layer(False), q, k, v, mask, sliding_window=4)


def test_one_unpadding_per_forward(device, monkeypatch):
    """A padded forward finds the kept tokens (nonzero: a device sync) once, not once per layer: every
    layer of a forward gets the same mask tensor. The same tensor changed in place is unpadded again.
    Likewise a batch-1 forward with position_ids looks for packed sequences once."""
    calls = []
    real = dt.unpad_attention
    monkeypatch.setattr(dt, "unpad_attention", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(dt, "_LAST", {})
    ours, _, _ = _models("llama", device)  # 2 layers
    ids, mask = _batch(device, pad_side="right")
    with torch.no_grad():
        first = ours(input_ids=ids, attention_mask=mask).logits
        assert len(calls) == 1
        again = ours(input_ids=ids, attention_mask=mask).logits
        assert len(calls) == 2 and torch.equal(first, again)  # one per forward
    m = mask.bool()
    a = dt._unpadding(m, 24, 24, True, -1)
    assert dt._unpadding(m, 24, 24, True, -1) is a and len(calls) == 3
    b = dt._unpadding(m, 24, 24, True, 7)  # a sliding layer: its own plan, kept beside the full layers' one
    assert dt._unpadding(m, 24, 24, True, -1) is a and dt._unpadding(m, 24, 24, True, 7) is b and len(calls) == 4
    m[0, -3:] = False  # in place: the version moves
    assert dt._unpadding(m, 24, 24, True, -1).cu_k.tolist() == [0, 21, 38] and len(calls) == 5
    # position_ids (batch 1): whether the row packs several sequences (a sync) is found once per forward too
    found = []
    real_restarts = dt._restarts
    monkeypatch.setattr(dt, "_restarts", lambda pos: (found.append(1), real_restarts(pos))[1])
    pos = torch.cat([torch.arange(10), torch.arange(14)]).unsqueeze(0).to(device)
    with torch.no_grad():
        ours(input_ids=ids[:1], position_ids=pos)
    assert len(found) == 1


def test_packed_rows_through_position_ids(device):
    """One row packing three sequences (position_ids restart): equal to the three run alone."""
    ours, _, _ = _models("llama", device)
    ours.eval()
    gen = torch.Generator().manual_seed(2)
    lengths = (9, 5, 12)
    ids = torch.randint(0, VOCAB, (1, sum(lengths)), generator=gen).to(device)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).to(device)
    with torch.no_grad():
        packed = ours(input_ids=ids, position_ids=pos).logits[0]
        alone = torch.cat([ours(input_ids=part).logits[0] for part in ids.split(lengths, 1)])
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("positions", [[*range(5, 11), *range(6)], [5, 4, 3, 2, 1, 0], [0, 1, 2, 2, 3, 4, 0, 1],
                                       [*range(3, 9), *range(4)]])
def test_packed_rows_in_any_order_equal_sdpa(device, positions):
    """A packed row whose first segment does not start at its smallest position (segments in any order, a
    position that falls or repeats): each segment starts where the position is not the previous one plus 1,
    as transformers' sdpa masks it; every row written (before, the first segment's rows were left empty)."""
    ours, plain, _ = _models("llama", device)
    ours.eval()
    plain.eval()
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, VOCAB, (1, len(positions)), generator=gen).to(device)
    pos = torch.tensor([positions], device=device)
    with torch.no_grad():  # no cache: sdpa's masks find packed rows only then (as in training)
        got = ours(input_ids=ids, position_ids=pos, use_cache=False).logits
        want = plain(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_sequence_starts_follow_transformers():
    from transformers.masking_utils import find_packed_sequence_indices

    from diyflash.integrations.padding import sequence_starts, sequences_from_positions

    for positions in ([0, 1, 2, 0, 1], [5, 6, 0, 1, 2], [3, 2, 1], [0, 1, 1, 2], [4, 5, 6], [0]):
        pos = torch.tensor([positions])
        seq = find_packed_sequence_indices(pos)
        want = torch.zeros(len(positions), dtype=torch.bool) if seq is None else torch.diff(
            seq[0], prepend=seq[0, :1] - 1) != 0
        want[0] = True
        assert sequence_starts(pos).tolist() == want.tolist(), positions
        cu = sequences_from_positions(pos)
        assert cu.tolist() == [*want.nonzero().squeeze(1).tolist(), len(positions)]


def test_compiled_training_step_has_no_graph_break(device):
    ours, _, _ = _models("llama", device)
    ids, _ = _batch(device)
    calls = []
    ours.model.layers[0].self_attn.register_forward_hook(lambda *a: calls.append(1))
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    compiled = torch.compile(ours, fullgraph=True)
    out = compiled(input_ids=ids, labels=ids)
    out.loss.backward()
    assert not counts["graph_break"] and calls  # compiled through our attention, in one graph
    grads = {n: p.grad.clone() for n, p in ours.named_parameters()}
    ours.zero_grad()
    eager = ours(input_ids=ids, labels=ids)
    eager.loss.backward()
    torch.testing.assert_close(out.logits, eager.logits, atol=1e-4, rtol=1e-4)
    for n, p in ours.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-4, rtol=1e-4)


def test_register_is_idempotent_and_switches_models(device):
    assert dt.register() == dt.register() == dt.ATTN_IMPLEMENTATION
    assert "flash" not in dt.ATTN_IMPLEMENTATION
    cfg, _ = _config("llama")
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.set_attn_implementation(dt.ATTN_IMPLEMENTATION)
    assert model.config._attn_implementation == dt.ATTN_IMPLEMENTATION


def test_what_the_kernels_cannot_express_raises(device):
    ours, _, _ = _models("llama", device)
    ids, mask = _batch(device)
    attn = ours.model.layers[0].self_attn
    q = torch.randn(2, 4, 8, 16, device=device)
    k = v = torch.randn(2, 2, 8, 16, device=device)
    attn.train()
    with pytest.raises(NotImplementedError, match="dropout=0.1"):
        dt.attention_forward(attn, q, k, v, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="4-D attention mask"):
        dt.attention_forward(attn, q, k, v, torch.zeros(2, 1, 8, 8, device=device))
    with pytest.raises(NotImplementedError, match="output_attentions"):
        dt.attention_forward(attn, q, k, v, None, output_attentions=True)


@pytest.mark.skipif(not ON_GPU, reason="head_dim 256 in bf16: GPU suite (the interpreter would take minutes)")
def test_gemma2_head_dim_256_bf16(device):
    """Right padding: left-padded training gives NaN in transformers' own eager path (see
    test_training_step_meets_the_error_rule), which is the peer here."""
    ids, mask = _batch(device, length=300, pad_side="right")
    _, report = _steps(_models("gemma2", device, head_dim=256, dtype=torch.bfloat16), ids, mask)
    assert report.ok, str(report)
