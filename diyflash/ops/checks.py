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


def attention_shape_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """The one rule for q, k, v shapes (the ops and the API say it alike): None when they fit, else the
    sentence saying why not. 4-D: q (B, H, N_q, D), k (B, H_kv, N_k, D), v (B, H_kv, N_k, D_v) with
    H_kv dividing H (GQA/MQA); 3-D: (BH, N, D) with one head per slice."""
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        return f"Expected 3D or 4D tensors of the same rank, got {shapes}"
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        return f"Incompatible shapes {shapes}: the batch (dim 0) must match"
    if k.shape[-1] != q.shape[-1]:
        return f"Incompatible shapes {shapes}: q and k must have the same head_dim"
    if v.shape[:-1] != k.shape[:-1]:
        return f"Incompatible shapes {shapes}: v must have k's batch, heads and length (its head_dim may differ)"
    if q.dim() == 4:
        h, h_kv = q.shape[1], k.shape[1]
        if h_kv == 0 or h % h_kv:
            return (f"Incompatible shapes {shapes}: the number of query heads ({h}) must be a multiple of the "
                    f"number of kv heads ({h_kv})")
    for name, d in (("q/k", q.shape[-1]), ("v", v.shape[-1])):
        error = head_dim_error(d)
        if error:
            return f"{error} ({name} head_dim)"
    return None


def check_attention_shapes(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    error = attention_shape_error(q, k, v)
    if error:
        raise ValueError(f"diyflash::{op}: {error}")


def variant_error(q: torch.Tensor, window_left, window_right, softcap, alibi_slopes, sinks) -> tuple[type, str] | None:
    """The one rule for the variant arguments (the ops and the API say it alike): None when they are
    valid, else (exception type, sentence). alibi_slopes: (H,) or (B, H); sinks: (H,); both fp32 (fp64
    beside fp64 inputs) on q's device, and need 4-D inputs, whose dim 1 says H."""
    for name, side in (("window left", window_left), ("window right", window_right)):
        if isinstance(side, bool) or not isinstance(side, (int, torch.SymInt)):
            return TypeError, f"{name} must be an int, got {type(side).__name__} {side!r}"
        if side < -1:
            return ValueError, f"{name} must be -1 (unbounded) or >= 0, got {side}"
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, torch.SymFloat)):
        return TypeError, f"softcap must be a float, got {type(softcap).__name__} {softcap!r}"
    if not softcap >= 0 or softcap == float("inf"):
        return ValueError, f"softcap must be finite and >= 0 (0 = off), got {softcap}"
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    heads = q.shape[1] if q.dim() == 4 else None
    for name, t, shapes in (("alibi_slopes", alibi_slopes, ((heads,), (q.shape[0], heads))),
                            ("sinks", sinks, ((heads,),))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            return TypeError, f"{name} must be a torch.Tensor or None, got {type(t).__name__}"
        if heads is None:
            return ValueError, f"{name} needs 4-D inputs (B, H, N, D), got q of shape {tuple(q.shape)}"
        if tuple(t.shape) not in shapes:
            wanted = " or ".join(str(s) for s in shapes)
            return ValueError, f"{name} must have shape {wanted}, got {tuple(t.shape)}"
        if t.dtype not in allowed:
            return TypeError, f"{name} must be float32, got {t.dtype}"
        if t.device != q.device:
            return ValueError, f"{name} must be on the inputs' device {q.device}, got {t.device}"
    return None


def check_variants(op: str, q: torch.Tensor, window_left, window_right, softcap, alibi_slopes, sinks) -> None:
    error = variant_error(q, window_left, window_right, softcap, alibi_slopes, sinks)
    if error:
        kind, message = error
        raise kind(f"diyflash::{op}: {message}")
