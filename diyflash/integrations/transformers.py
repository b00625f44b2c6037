"""diyflash as a Hugging Face transformers attention backend.

    import diyflash.integrations.transformers as dt          # registers it (register() is idempotent)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=dt.ATTN_IMPLEMENTATION)
    model.set_attn_implementation(dt.ATTN_IMPLEMENTATION)    # or switch a loaded model

The name has no "flash" in it: transformers 5.x routes any name containing "flash" to its flash-attention
kernel loader. Registered through the public AttentionInterface and AttentionMaskInterface: the mask
function is transformers' own flash_attention_mask (so no 4-D mask is ever built; the attention function
gets a (B, S) padding mask or None), or, for a static cache, the spans of its filled keys (mask_function).

What transformers passes maps onto diyflash natively: GQA (k and v never repeated), `scaling`,
`sliding_window` (window (w - 1, w - 1), causal caps the right side), `softcap` (Gemma 2), `s_aux`
(gpt-oss's sinks), causal aligned bottom-right (decode steps: q shorter than k). A left-padded decode step
(mask_function's spans) reads the cache in place through flash_attention_with_kvcache's cache_leftpad;
other padding (right or left) runs the kept tokens as packed sequences through flash_attention_varlen, every query row (pad rows too)
as sdpa's mask computes it (padding.unpad_attention); packed rows (batch 1, position_ids restarting) and
the padding-free collator's cu_seq_lens_* run as packed sequences too. A static cache
(cache_implementation="static") hands attention its whole preallocated buffer: mask_function passes the
filled keys' spans instead of a mask, each row's count, and with left padding each row's first key too
(one shape for every decode step, so generate's compiled forward does not recompile per length), and the
call goes through flash_attention_with_kvcache with cache_leftpad (no sync inside the forward; inference
only). Right padding or gaps keep the mask, cut to the tokens seen so far (the empty slots past it are
left out), as transformers' flash path does.
Attention dropout in training, output_attentions and a custom 4-D mask raise NotImplementedError.
"""

from __future__ import annotations

import weakref

import torch

from ..api import flash_attention, flash_attention_varlen, flash_attention_with_kvcache
from .padding import pad, sequence_starts, sequences_from_positions, token_major, unpad_attention

ATTN_IMPLEMENTATION = "diyattention"


def _variants(sliding_window, softcap, s_aux):
    window = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, int(sliding_window) - 1)
    sinks = None if s_aux is None else s_aux.float()  # (H,) logits; diyflash takes them in fp32
    return dict(window_size=window, softcap=0.0 if softcap is None else float(softcap), sinks=sinks)


def _packed_call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, variants):
    return flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, validate=False, **variants)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      s_aux: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, H, L, D), key and value (B, H_kv, S, D);
    returns ((B, L, H, D_v), None)."""
    if dropout and module.training:
        raise NotImplementedError(f"diyflash has no attention dropout; got dropout={dropout} in training "
                                  "(set the config's attention_dropout to 0 or call model.eval())")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("diyflash does not materialise attention weights (output_attentions=True)")
    if attention_mask is not None and attention_mask.dim() not in (1, 2):
        raise NotImplementedError(
            f"diyflash takes a (batch, keys) padding mask; got a {attention_mask.dim()}-D attention mask of shape "
            f"{tuple(attention_mask.shape)} (a custom mask the kernels cannot express)")
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    variants = _variants(sliding_window, softcap, s_aux)
    batch, _, len_q, _ = query.shape
    len_k = key.shape[2]

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:  # the padding-free collator: sequences flattened into one row
        max_q, max_k = kwargs.get("max_length_q") or batch * len_q, kwargs.get("max_length_k") or batch * len_k
        out = _packed_call(token_major(query), token_major(key), token_major(value), cu_q.to(torch.int32),
                           cu_k.to(torch.int32), int(max_q), int(max_k), causal, scaling, variants)
        return out.view(batch, len_q, *out.shape[1:]), None

    if attention_mask is not None and attention_mask.dim() == 1:  # mask_function's key spans of a KV cache
        if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
            raise NotImplementedError("diyflash attends to a static cache (cache_implementation='static') in inference "
                                      "only: call the model under torch.no_grad()")
        if attention_mask.shape[0] not in (batch, 2 * batch):
            raise ValueError(f"a 1-D attention mask is mask_function's key counts ({batch},) or ends and starts "
                             f"({2 * batch},) of a KV cache; got shape {tuple(attention_mask.shape)}")
        spans = attention_mask if attention_mask.device == query.device else attention_mask.to(query.device)
        filled, starts = (spans, None) if spans.shape[0] == batch else (spans[:batch], spans[batch:])
        out = flash_attention_with_kvcache(query, key, value, filled, cache_leftpad=starts, causal=causal,
                                           sm_scale=scaling, validate=False, **variants)
        return out.transpose(1, 2), None

    if attention_mask is not None:
        if attention_mask.shape[1] < len_k:  # a static cache: its slots past the mask's length are not filled yet
            len_k = attention_mask.shape[1]
            key, value = key[:, :, :len_k], value[:, :, :len_k]
        plan = _unpadding(attention_mask, len_q, len_k, causal, variants["window_size"][0])
        keys, values, rows = token_major(key), token_major(value), token_major(query)  # views, or one copy each
        k, v = keys[plan.keep_k], values[plan.keep_k]
        q = rows if plan.keep_q is None else rows[plan.keep_q]
        out = _packed_call(q, k, v, plan.cu_q, plan.cu_k, len_q, len_k, causal, scaling,
                           dict(variants, window_size=(plan.left, plan.left)))
        if plan.keep_q is None:
            return out.view(batch, len_q, *out.shape[1:]), None
        parts = [(plan.keep_q, out)]
        if plan.tail is not None:  # right padding: the pad rows after the last kept key
            tail_rows, dest, cu_tail, slots, left = plan.tail
            tail = _packed_call(rows[tail_rows], k, v, cu_tail, plan.cu_k, slots, len_k, False, scaling,
                                dict(variants, window_size=(left, -1)))
            parts.append((dest, tail))
        if plan.gaps is not None:  # pad rows inside a gap: each run against a copy of the keys before it
            gap_rows, prefix, cu_gq, cu_gk, max_gq, max_gk = plan.gaps
            gap = _packed_call(rows[gap_rows], keys[prefix], values[prefix], cu_gq, cu_gk, max_gq, max_gk, False,
                               scaling, dict(variants, window_size=(-1, -1)))
            parts.append((gap_rows, gap))
        return pad(parts, batch, len_q), None

    position_ids = kwargs.get("position_ids")
    cu = None
    if batch == 1 and len_q > 1 and len_q == len_k and position_ids is not None:
        cu = _per_forward("positions", position_ids, None, lambda: _packed_sequences(position_ids))
    if cu is not None:
        out = _packed_call(token_major(query), token_major(key), token_major(value), cu, cu, len_q, len_k, causal,
                           scaling, variants)
        return out.view(1, len_q, *out.shape[1:]), None

    out = flash_attention(query, key, value, causal, scaling, **variants)
    return out.transpose(1, 2), None


_LAST: dict = {}  # per kind: (weakref to the last tensor, its version, {extra: result})


def _per_forward(kind: str, t: torch.Tensor, extra, compute):
    """compute(), remembered for t: every layer of a forward gets the same mask and position_ids tensors,
    so eagerly what is derived from them (and its device sync) is computed once per forward and reused
    while t is unchanged (same object, same version), one result per extra (alternating sliding and full
    layers ask with different extras); never while compiling, nor for inference-mode tensors, which have
    no version."""
    eager = not (torch.compiler.is_compiling() or torch.compiler.is_exporting())
    version = _version(t) if eager else None
    if version is None:
        return compute()
    last = _LAST.get(kind)
    if last is None or last[0]() is not t or last[1] != version:
        last = _LAST[kind] = (weakref.ref(t), version, {})
    if extra not in last[2]:
        last[2][extra] = compute()
    return last[2][extra]


SPAN_ROWS = 64  # the query rows up to which a left-padded step of a dynamic cache runs on the KV-cache kernel


def mask_function(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0, **kwargs):
    """The mask function registered with transformers: its flash_attention_mask (a (B, keys) padding mask,
    or None), except for a static cache (StaticLayer, StaticSlidingWindowLayer), whose keys attention_forward
    then takes as flash_attention_with_kvcache's spans: an int32 1-D tensor of each row's key count, (B,),
    or of its ends then its starts, (2B,), for a left-padded batch (cache_leftpad).
    - No mask where the buffer has more keys than are filled (flash_attention_mask gives None there, and
      bottom-right causal alignment over the whole buffer attended to its empty slots): the count
      q_offset + q_length - kv_offset, on the device (q_offset is the static cache's tensor).
    - A mask made eagerly (generate makes a static cache's masks before its compiled forward) whose every
      row is pad slots then keys (left padding, or none): the spans, after one sync. The mask grows a column
      a step, and a compiled decode step recompiled for every length; the spans have one shape for all.
    - The same for a left-padded decode step of any other cache (a few query rows after cached keys, made
      without grad, as generate does): the kernel reads the cache where it is, where the mask's packed
      sequences gathered a copy of every key and value a layer a step.
    Any other mask (right padding, gaps, a prefill, training) stays the mask."""
    from transformers.masking_utils import flash_attention_mask

    given = kwargs.get("attention_mask")
    if given is not None and given.dim() == 1:  # spans this function made already: generate makes a static
        return given                             # cache's masks before the forward, which asks again with them
    mask = flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset, **kwargs)
    static = isinstance(q_offset, torch.Tensor)
    if mask is not None:
        decode = q_length < kv_length and q_length <= SPAN_ROWS and not torch.is_grad_enabled()
        if (static or decode) and not torch.compiler.is_compiling():
            spans = _key_spans(mask)
            if spans is not None:
                return spans
        return mask
    if static:
        filled = (q_offset + (q_length - kv_offset)).to(torch.int32).reshape(1)
        return filled.expand(batch_size)
    if q_offset + q_length - kv_offset < kv_length:
        return torch.full((batch_size,), q_offset + q_length - kv_offset, dtype=torch.int32, device=kwargs.get("device"))
    return None


def _key_spans(mask: torch.Tensor) -> torch.Tensor | None:
    """A (B, S) padding mask whose rows are each pad slots then keys, as int32 spans: every row's end S,
    (B,), where no row is padded, else the ends then each row's first key, (2B,). None for any other mask.
    One device sync."""
    mask = mask.to(torch.bool)
    batch, width = mask.shape
    starts = (~mask).sum(1)
    left_padded = (mask == (torch.arange(width, device=mask.device) >= starts[:, None])).all()
    left_padded, padded = torch.stack([left_padded, starts.any()]).tolist()
    if not left_padded:
        return None
    ends = torch.full((batch,), width, dtype=torch.int32, device=mask.device)
    return torch.cat([ends, starts.to(torch.int32)]) if padded else ends


def _unpadding(attention_mask: torch.Tensor, len_q: int, len_k: int, causal: bool, left: int):
    """padding.unpad_attention of a (B, keys) padding mask, once per forward (_per_forward)."""
    return _per_forward("mask", attention_mask, (len_q, len_k, causal, left),
                        lambda: unpad_attention(attention_mask[:, -len_k:].to(torch.bool), len_q, len_k, causal, left))


def _packed_sequences(position_ids: torch.Tensor) -> torch.Tensor | None:
    """cu_seqlens of the sequences one row of position_ids packs, or None when it holds one sequence."""
    return sequences_from_positions(position_ids) if _restarts(position_ids) else None


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor keeps no version counter: nothing is cached for it
        return None


def _restarts(position_ids: torch.Tensor) -> bool:
    """Whether one row of position_ids packs several sequences (padding.sequence_starts past its first
    token). Eagerly a device sync; while compiling, always True (sequences_from_positions then keeps shapes
    static)."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True
    return bool(sequence_starts(position_ids)[1:].any())


def register() -> str:
    """Register the attention function and its mask function with transformers (idempotent); returns the
    name to pass as attn_implementation."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:  # pragma: no cover - exercised without the extra only
        raise ModuleNotFoundError(
            "diyflash.integrations.transformers needs transformers: pip install 'diyflash[transformers]'") from e
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, mask_function)
    return ATTN_IMPLEMENTATION


register()
