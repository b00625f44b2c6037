"""Checks the ops make of their own inputs, for callers of torch.ops.diyflash.* that skip the API's.

The fakes run them too, so a compiled or exported graph fails at trace time, not inside a kernel.
"""

from __future__ import annotations

import torch


def one_device(op: str, **tensors: torch.Tensor | None) -> None:
    """Every given tensor on one device. The dispatcher picks one backend for a call with tensors on
    several (CUDA over CPU, Meta over both): without this check a kernel read another device's memory
    through a pointer (Triton's interpreter silently read a meta tensor's missing data)."""
    devices = [t.device for t in tensors.values() if t is not None]
    if devices.count(devices[0]) == len(devices):  # under 1 us: the ops pay it per eager call
        return
    listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items() if t is not None)
    raise ValueError(f"diyflash::{op}: inputs must be on one device, got {listed}")


# What the ops compute: fp16, bf16 and fp32 on every path; fp64 on the PyTorch path (for gradcheck).
OP_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 256
INT32_MAX = 2**31 - 1


def check_dtype(op: str, **tensors: torch.Tensor) -> None:
    """A dtype the kernels compute. Without it the PyTorch path computed int, bool, fp8 and complex
    inputs and truncated them (complex lost its imaginary part), and the interpreter crashed."""
    for name, t in tensors.items():
        if t.dtype not in OP_DTYPES:
            raise TypeError(f"diyflash::{op}: Unsupported dtype {t.dtype} for {name}: supported are "
                            "torch.float16, torch.bfloat16, torch.float32 (and torch.float64, PyTorch path)")


def head_dim_error(head_dim: int) -> str | None:
    """The one head_dim rule (the ops, the API, the selector and the CLIs say it alike): None when the
    kernels support head_dim, else the sentence saying why not."""
    if head_dim % 8 != 0 or not 8 <= head_dim <= MAX_HEAD_DIM:
        return f"Unsupported head_dim {head_dim}: supported are multiples of 8 from 8 to {MAX_HEAD_DIM}"
    return None


def check_head_dim(op: str, head_dim: int) -> None:
    error = head_dim_error(head_dim)
    if error:
        raise ValueError(f"diyflash::{op}: {error}")


def check_seq_lens(op: str, seq_lens: torch.Tensor | None, batch: int, device: torch.device) -> None:
    """seq_lens: (batch,) integers on the inputs' device, or on the CPU beside CUDA inputs (the op then
    moves its few integers). Any other device was read as if it were the inputs' (a meta seq_lens gave
    uninitialised memory as lengths)."""
    if seq_lens is None:
        return
    if seq_lens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"diyflash::{op}: seq_lens must be int32 (or int64), got {seq_lens.dtype}")
    if tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"diyflash::{op}: seq_lens must have shape ({batch},), got {tuple(seq_lens.shape)}")
    if seq_lens.device != device and not (seq_lens.device.type == "cpu" and device.type == "cuda"):
        raise ValueError(f"diyflash::{op}: seq_lens must be on the inputs' device {device} (or on the CPU "
                         f"beside CUDA inputs), got {seq_lens.device}")
