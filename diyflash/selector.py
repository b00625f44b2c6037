"""Kernel selection for this machine (the seed's AdaptiveKernelSelector and its shortcuts).

The configurations reported are the ones the kernels actually run with here: they come from the same
functions the launchers call (the matmul autotuner, the attention tile tables after shared-memory
pruning), not from a table kept beside the code.
"""

from __future__ import annotations

from typing import Callable

import torch

from .api import flash_attention, triton_matmul
from .ops.checks import head_dim_error
from .ops.runtime import PYTORCH_PATH_BLOCK_N as TORCH_PATH_BLOCK_N
from .ops.runtime import attention_tiles, interpreter_active, matmul_choice, matmul_interpreter_tiles
from .utils.gpu import check_hopper_features, detect_gpu, supports_fp8


def _cpu_backend() -> str:
    return "triton-interpreter" if interpreter_active() else "pytorch"


class AdaptiveKernelSelector:
    """What diyflash runs on device `device_id` (CPU-only machines: the interpreter or the PyTorch path)."""

    def __init__(self, device_id: int = 0):
        self.on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", device_id) if self.on_gpu else torch.device("cpu")
        self.capabilities = detect_gpu(device_id) if self.on_gpu else None
        self.features = check_hopper_features(device_id)

    def _where(self) -> dict:
        if self.capabilities is None:
            return {"device": "cpu", "backend": _cpu_backend(),
                    "note": "no CUDA GPU: kernels run through Triton's interpreter (TRITON_INTERPRET=1) or PyTorch"}
        return {"device": self.capabilities.name, "arch": self.capabilities.arch.value, "backend": "triton"}

    def get_matmul_config(self, m: int = 4096, n: int = 4096, k: int = 4096,
                          dtype: torch.dtype = torch.float16) -> dict:
        """The tiles diyflash.triton_matmul uses for an (m, k) @ (k, n) product of this dtype. On a GPU this
        runs the autotuner for that shape bucket if it has not run yet (seconds, once per process)."""
        if not self.on_gpu:
            cfg = matmul_interpreter_tiles() if interpreter_active() else {}
            return {**self._where(), **cfg, "shape": (m, n, k), "dtype": str(dtype)}
        a = torch.randn(m, k, device=self.device, dtype=dtype)
        b = torch.randn(k, n, device=self.device, dtype=dtype)
        cfg, tma = matmul_choice(a, b)
        uses_tma = tma and self.features["tma_available"]
        return {**self._where(), **cfg, "tma": uses_tma, "autotuned": True,
                "shape": (m, n, k), "dtype": str(dtype)}

    def get_attention_config(self, head_dim: int = 64, dtype: torch.dtype = torch.float16,
                             causal: bool = False, seq_len: int | None = None) -> dict:
        """The forward and backward (dk/dv and dq kernels) tiles diyflash.flash_attention uses for this
        head_dim, dtype and causal setting, and sequences of seq_len (the longer of queries and keys;
        None: the tiles of long sequences)."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int):
            raise TypeError(f"head_dim must be an int, got {type(head_dim).__name__} {head_dim!r}")
        if head_dim_error(head_dim):
            raise ValueError(head_dim_error(head_dim))
        interpret = not self.on_gpu and interpreter_active()
        if not self.on_gpu and not interpret:
            return {**self._where(), "head_dim": head_dim, "dtype": str(dtype), "block_n": TORCH_PATH_BLOCK_N,
                    "note": f"PyTorch blocked implementation ({TORCH_PATH_BLOCK_N} keys per block)"}
        pad, fwd, bwd = attention_tiles(head_dim, dtype, self.device, causal, interpret, seq_len)
        # TMA: some kernel reads through tensor descriptors (for inputs they can address)
        uses_tma = self.features["tma_available"] and any(c.tma for c in (fwd, *bwd.kernels()))
        return {**self._where(), "head_dim": head_dim, "head_dim_pad": pad, "dtype": str(dtype), "tma": uses_tma,
                "causal": causal, "seq_len": seq_len, "forward": fwd.as_dict(), "backward": bwd.as_dict()}

    def select_matmul_kernel(self) -> Callable:
        """diyflash.triton_matmul where it runs (GPU, or CPU under the interpreter), else a function with
        its signature over the op's PyTorch path."""
        if self.on_gpu or interpreter_active():
            return triton_matmul
        return _matmul_pytorch_path

    def select_attention_kernel(self) -> Callable:
        """diyflash.flash_attention where it runs, else a function with its signature (sm_scale, not the
        op's scale) over the op's PyTorch path."""
        if self.on_gpu or interpreter_active():
            return flash_attention
        return _attention_pytorch_path


def _attention_pytorch_path(q, k, v, causal: bool = False, sm_scale: float | None = None, seq_lens=None):
    """flash_attention's signature and semantics on a CPU-only machine without the interpreter:
    torch.ops.diyflash.attention's PyTorch path (blocked over keys, the same algorithm)."""
    return torch.ops.diyflash.attention(q, k, v, causal=causal, scale=sm_scale, seq_lens=seq_lens)


def _matmul_pytorch_path(a, b, block_m=None, block_n=None, block_k=None, use_autotune: bool = True,
                         allow_tf32: bool = False):
    """triton_matmul's signature on a CPU-only machine without the interpreter: the op's PyTorch path
    (torch.matmul), which has no tiles to pin."""
    return torch.ops.diyflash.matmul(a, b, None, use_autotune, allow_tf32)


def get_matmul_config(**kwargs) -> dict:
    return AdaptiveKernelSelector().get_matmul_config(**kwargs)


def get_attention_config(**kwargs) -> dict:
    return AdaptiveKernelSelector().get_attention_config(**kwargs)


def get_optimal_matmul() -> Callable:
    return AdaptiveKernelSelector().select_matmul_kernel()


def get_optimal_attention() -> Callable:
    return AdaptiveKernelSelector().select_attention_kernel()


__all__ = ["AdaptiveKernelSelector", "get_matmul_config", "get_attention_config", "get_optimal_matmul",
           "get_optimal_attention", "supports_fp8", "check_hopper_features"]
