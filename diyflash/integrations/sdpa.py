"""diyflash.scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's signature
and semantics on diyflash's kernels, for the cases the kernels express exactly; anything else raises
NotImplementedError naming it (never a silent fallback)."""

from __future__ import annotations

import torch

from ..api import flash_attention, flash_attention_varlen
from .padding import kept, token_major, uniform


def _key_padding(attn_mask: torch.Tensor, batch: int, len_k: int) -> torch.Tensor:
    """A bool mask broadcastable from (B, 1, 1, L_k) as (B, L_k), else NotImplementedError."""
    if attn_mask.dtype != torch.bool:
        raise NotImplementedError(
            f"diyflash.scaled_dot_product_attention supports a boolean key-padding attn_mask only; got an additive "
            f"{attn_mask.dtype} mask of shape {tuple(attn_mask.shape)}")
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    if attn_mask.dim() > 4 or shape[1] != 1 or shape[2] != 1 or shape[0] not in (1, batch) or shape[3] not in (1, len_k):
        raise NotImplementedError(
            f"diyflash.scaled_dot_product_attention supports a key-padding attn_mask broadcastable from "
            f"(B, 1, 1, L_k) = ({batch}, 1, 1, {len_k}) only; got a general mask of shape {tuple(attn_mask.shape)}")
    return attn_mask.reshape(shape[0], shape[3]).expand(batch, len_k)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention on diyflash's kernels.

    query (B, H, L, E) or (N, L, E); key (B, H_kv, S, E); value (B, H_kv, S, E_v) (or the 3-D forms).
    - is_causal is SDPA's top-left causal mask: query i sees keys j <= i, also when L != S (diyflash's own
      `causal` aligns bottom-right: query i sees j <= i + S - L). L < S reads the first L keys (a slice,
      no copy); L > S is a window of (-1, L - S) around the bottom-right diagonal. A query row that sees no
      key outputs 0 (SDPA's math backend gives NaN there).
    - attn_mask: None, or a boolean key-padding mask (True = take part) broadcastable from (B, 1, 1, S).
      The kept keys are gathered and run as packed sequences (flash_attention_varlen): one copy of q, k
      and v, and a device sync to count them, as flash-attn's unpadding does. A general (.., L, S) mask,
      an additive float mask, dropout_p > 0 and is_causal with attn_mask (which SDPA refuses too) raise.
    - enable_gqa: H a multiple of H_kv, k and v read in place (never repeated), as SDPA's enable_gqa.
    - scale: the softmax scale, default 1 / sqrt(E).
    Differentiable in query, key and value. dtypes, devices and head dims as diyflash.flash_attention.
    """
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):  # bool("no") is True: refused as SDPA refuses it
            raise TypeError(f"scaled_dot_product_attention: {name} must be a bool, got {type(flag).__name__} {flag!r}")
    if dropout_p != 0.0:
        raise NotImplementedError(f"diyflash.scaled_dot_product_attention has no dropout; got dropout_p={dropout_p}")
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        raise NotImplementedError(
            f"diyflash.scaled_dot_product_attention takes 3-D or 4-D query, key and value of one rank; got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True")
    if query.shape[-3] != key.shape[-3] and not enable_gqa:
        raise RuntimeError(
            f"scaled_dot_product_attention: query has {query.shape[-3]} heads and key {key.shape[-3]}; "
            "pass enable_gqa=True for grouped-query attention")
    if query.dim() == 3 and query.shape[0] != key.shape[0]:
        raise NotImplementedError("diyflash.scaled_dot_product_attention: grouped-query attention needs 4-D inputs")
    len_q, len_k = query.shape[-2], key.shape[-2]
    if attn_mask is not None:
        if query.dim() == 3:
            raise NotImplementedError("diyflash.scaled_dot_product_attention: attn_mask needs 4-D inputs (B, H, L, E)")
        batch = query.shape[0]
        keep, cu_k = kept(_key_padding(attn_mask, batch, len_k))
        q = token_major(query)
        k, v = token_major(key)[keep], token_major(value)[keep]
        cu_q = uniform(batch, len_q, query.device)
        out = flash_attention_varlen(q, k, v, cu_q, cu_k, len_q, len_k, sm_scale=scale, validate=False)
        return out.view(batch, len_q, *out.shape[1:]).transpose(1, 2)
    if not is_causal:
        return flash_attention(query, key, value, sm_scale=scale)
    if len_q <= len_k:  # keys past L are seen by no query: the first L, where top-left == bottom-right
        return flash_attention(query, key[..., :len_q, :], value[..., :len_q, :], causal=True, sm_scale=scale)
    return flash_attention(query, key, value, sm_scale=scale, window_size=(-1, len_q - len_k))
