"""diyflash: exact FlashAttention and matmul kernels in Triton, as torch.library custom ops.

Importing diyflash registers every op: torch.ops.diyflash.attention (and its internal
attention_fwd / attention_bwd) and torch.ops.diyflash.matmul, usable in eager code,
torch.compile(fullgraph=True) and torch.export.
"""

from . import ops  # noqa: F401  (registers torch.ops.diyflash.*)
from .api import (cache_info, clear_caches, flash_attention, flash_attention_varlen, flash_attention_with_kvcache,
                  triton_matmul)
from .integrations.sdpa import scaled_dot_product_attention
from .precompile import precompile
from .reference import reference_attention
from .selector import (
    AdaptiveKernelSelector,
    check_hopper_features,
    get_attention_config,
    get_matmul_config,
    get_optimal_attention,
    get_optimal_matmul,
    supports_fp8,
)

from ._version import __version__

__all__ = [
    "flash_attention",
    "flash_attention_varlen",
    "flash_attention_with_kvcache",
    "scaled_dot_product_attention",
    "triton_matmul",
    "clear_caches",
    "cache_info",
    "reference_attention",
    "precompile",
    "AdaptiveKernelSelector",
    "check_hopper_features",
    "get_attention_config",
    "get_matmul_config",
    "get_optimal_attention",
    "get_optimal_matmul",
    "supports_fp8",
    "__version__",
]
