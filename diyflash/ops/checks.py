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
