"""Kernels: Triton @triton.jit kernels with their launchers, and the PyTorch path.

Never imports torch.library, diyflash.ops or diyflash.api. Importing this package does not import
triton; `diyflash.kernels.attention` does (and raises "triton is required" without it).
"""

import sys

from ._runtime import device_guard, interpreter_active, require_triton, uses_triton

__all__ = ["cache_info", "clear_caches", "device_guard", "interpreter_active", "require_triton", "uses_triton"]

# the modules that keep host-speed state between calls, each with its own cache_info() and clear_caches();
# one not imported yet has nothing kept (asking it must not import triton)
_KEEPERS = ("diyflash.kernels.attention.launch", "diyflash.kernels.attention.kvcache", "diyflash.kernels.matmul")


def cache_info() -> dict[str, int]:
    """What the launchers keep between calls, by kind: counts (and bytes of kept buffers)."""
    info: dict[str, int] = {}
    for name in _KEEPERS:
        module = sys.modules.get(name)
        if module is not None:
            info.update(module.cache_info())
    return info


def clear_caches() -> None:
    """Forget everything the launchers keep between calls (see each module's clear_caches)."""
    for name in _KEEPERS:
        module = sys.modules.get(name)
        if module is not None:
            module.clear_caches()
