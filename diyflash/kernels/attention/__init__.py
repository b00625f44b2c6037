"""FlashAttention-2 forward and backward in Triton, and their launchers.

Ladder: `_attn_fwd_kernel` (jit, forward.py) -> `attention_fwd` (launcher, launch.py) ->
`diyflash::attention_fwd` (op, in diyflash/ops) -> `diyflash.flash_attention` (public). This package
knows nothing of torch.library.

Layout: every tensor is addressed through four strides (batch z, head h, row, dim), so any
permutation or slice of storage is read in place. A 3-D (BH, N, D) input is viewed as (BH, 1, N, D).

Semantics shared by all kernels (and by the PyTorch path in attention_torch.py), written once in
semantics.py as @triton.jit helpers that every kernel calls:
- scores are s = (q . k) * scale; the kernels work in base 2: qk_scale = scale * log2(e). Softcap
  (s = cap * tanh(s / cap)) and ALiBi (s -= slope * |i + off - j|) follow, in that order (_scores).
- causal: query i sees key j iff j <= i + (seq_len_k - seq_len_q) (bottom-right alignment); a window
  (left, right) bounds it to i + off - left <= j <= i + off + right (_visible); blocks outside are
  never visited (_band, _query_band).
- GQA: q head h reads kv head h // (H / H_kv); the dk/dv kernel sums a kv head's group in a fixed order.
- sinks: one more logit per head in each row's denominator (the forward's running max and sum start
  from it); the backward needs nothing more than the lse that includes it.
- packed sequences (varlen, Packed): token-major (T, H, D) tensors viewed as (1, H, T, D); sequence b
  is rows cu_seqlens_q[b]..[b+1] against keys cu_seqlens_k[b]..[b+1], causal and windows bottom-right
  to its own lengths (_sequence); the grid's z is the sequence. lse is (H, T_q).
- seq_lens[z] = L (optional): keys j >= L are ignored and query rows i >= L output 0 (lse = -inf).
  L is clamped to [0, N] inside the kernels, so a bad value can never read out of bounds.
- a row that sees no key outputs 0 and has lse = -inf; no NaN from finite inputs.
- lse is the natural-log log-sum-exp of the scaled scores, fp32, shape (Z, H, N_q).

Package layout (each file one part of the structure; the kernels know nothing of torch.library):
- semantics.py: which keys a query sees and which tiles a program computes (masks, key ranges, tile order);
- tiles.py: how tiles are read (pointer loads, TMA descriptors, row offsets);
- lazy.py: the forward's lazy rescaling (warp vote and predicated rescale);
- forward.py, backward.py, backward_rows.py: the kernels (backward_rows: the backward's row passes);
- forward_sm90.py, backward_sm90.py, hopper.py: the Hopper forward and one-pass backward (warp-specialized
  Gluon kernels) and where they run instead of the portable ones (sm_90, fp16/bf16, head_dim 128, no
  seq_lens/ALiBi; the backward not deterministic; the same semantics helpers);
- grids.py: how a grid is shaped (head groups of causal tiles, the GQA backward's head split);
- launch_args.py: what every launcher derives from a call alike (the variant, dtype switches, widths);
- views.py: how the launchers see a call's tensors ((Z, H, N, D) views, strides, TMA readability);
- plans.py: the host-speed machinery (launches remembered as plans bound to compiled kernels, their keys,
  host TMA descriptors);
- launch.py, launch_bwd.py: the launchers (attention_fwd; attention_bwd); fast.py: their plans as the
  API's fast path replays them (FastForward, FastBackward);
- decode.py, kvcache.py: KV-cache attention (cache append, split-KV decode, combine) and its launcher.
"""

from ..attention_configs import MAX_BLOCK_ROWS
from .kvcache import FastKV, attention_kvcache, fast_kvcache, num_splits_for
from .fast import FastBackward, FastForward, fast_backward, fast_forward
from .grids import GROUP_TILES_PER_SM, head_group
from .launch import attention_fwd, vote_rows
from .launch_bwd import attention_bwd
from ..contract import LOG2E
from .launch_args import INTERPRETED
from .plans import HOST_DESC_MIN_WORK, MAX_GRID_Z, host_descriptor, host_descriptors_ok
from .views import Packed, rows_fit_int32, tma_ok

__all__ = ["FastBackward", "FastForward", "FastKV", "GROUP_TILES_PER_SM", "HOST_DESC_MIN_WORK", "INTERPRETED",
           "LOG2E", "MAX_BLOCK_ROWS", "MAX_GRID_Z", "Packed", "attention_bwd", "attention_fwd", "attention_kvcache",
           "fast_backward", "fast_forward", "fast_kvcache", "head_group", "host_descriptor", "host_descriptors_ok",
           "num_splits_for", "rows_fit_int32", "tma_ok", "vote_rows"]
