"""Kernels: Triton @triton.jit kernels with their launchers, and the PyTorch path.

Never imports torch.library, diyflash.ops or diyflash.api. Importing this package does not import
triton; `diyflash.kernels.attention` does (and raises "triton is required" without it).
"""

from ._runtime import cache_info, clear_caches, device_guard, interpreter_active, require_triton, uses_triton

__all__ = ["cache_info", "clear_caches", "device_guard", "interpreter_active", "require_triton", "uses_triton"]
