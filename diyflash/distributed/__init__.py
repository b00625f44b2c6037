"""Context parallelism on torch.distributed: attention over a sequence sharded across ranks.

    shard = diyflash.distributed.shard_sequence(x, group=None, dim=-2, layout="zigzag")
    full = diyflash.distributed.gather_sequence(shard, group=None, dim=-2, layout="zigzag")
    out = diyflash.distributed.ring_attention(q, k, v, causal=False, sm_scale=None, *, group=None, ...)
    out = diyflash.distributed.ulysses_attention(q, k, v, causal=False, sm_scale=None, *, group=None, ...)
    out = diyflash.distributed.hybrid_attention(q, k, v, causal=False, sm_scale=None, *, mesh, ...)

Built on diyflash's public ops (torch.ops.diyflash.attention_fwd / attention_bwd, flash_attention) and
torch.distributed's point-to-point and all-to-all; any backend (NCCL on GPUs, gloo on CPU).
"""

from .hybrid import hybrid_attention
from .layout import LAYOUTS, chunks_of, gather_sequence, shard_sequence
from .ring import ring_attention
from .ulysses import ulysses_attention

__all__ = ["LAYOUTS", "chunks_of", "gather_sequence", "hybrid_attention", "ring_attention", "shard_sequence",
           "ulysses_attention"]
