"""Where users already are: `scaled_dot_product_attention` (a drop-in for PyTorch's) and the Hugging Face
transformers attention backend (`diyflash.integrations.transformers`, needs the `transformers` extra).
Both sit on the public API (diyflash.flash_attention, diyflash.flash_attention_varlen)."""

from .sdpa import scaled_dot_product_attention

__all__ = ["scaled_dot_product_attention"]
