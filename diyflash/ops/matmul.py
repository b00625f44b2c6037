"""diyflash::matmul: C = A @ B with an exact fake and an autograd formula whose backward calls
diyflash::matmul itself (dA = dC B^T, dB = A^T dC), reading the transposed views in place.

Devices: CUDA tensors run the Triton kernel; CPU tensors run it under TRITON_INTERPRET=1 and
torch.matmul otherwise; float64 always takes torch.matmul (it exists for gradcheck).
"""

from __future__ import annotations

import functools
import torch
from torch.library import custom_op

from ..kernels import device_guard, uses_triton
from .checks import check_dtype, one_device
from .autocast import register_autocast
from .eager import dispatcher_free
from .forward_ad import guard_autograd, refuse_forward_ad
from .registry import entry

_MATMUL = entry("matmul")


@functools.cache  # an import statement costs ~1 us per call even when the module is loaded
def _kernels():
    from ..kernels import matmul as triton_matmul  # imports triton (or explains its absence)

    return triton_matmul


def _matmul_impl(a, b, block_sizes, autotune, allow_tf32):
    """What the op computes on a real device: its CUDA/CPU kernel, and the API's eager shortcut."""
    if not uses_triton(a):
        # a fresh contiguous (M, N) tensor, as the kernel path and the fake
        return torch.matmul(a, b).contiguous()
    if block_sizes is not None:
        if len(block_sizes) != 3:
            raise ValueError(f"block_sizes must be (block_m, block_n, block_k), got {list(block_sizes)}")
        block_sizes = tuple(block_sizes)
    with device_guard(a):
        return _kernels().matmul_auto(a, b, block_sizes, autotune, allow_tf32)


def _check_operands(a, b):
    """What the op itself requires, for callers of torch.ops.diyflash.matmul that skip the API's checks
    (its fake runs it too, so a compiled graph fails at trace time, not inside a kernel)."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"diyflash::matmul expects 2-D a and b, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"diyflash::matmul: incompatible shapes {tuple(a.shape)} @ {tuple(b.shape)} "
                         f"(a.shape[1]={a.shape[1]} != b.shape[0]={b.shape[0]})")
    check_dtype("matmul", a=a, b=b)
    if a.dtype != b.dtype:
        raise TypeError(f"diyflash::matmul: dtypes must match, got a {a.dtype} and b {b.dtype}")
    one_device("matmul", a=a, b=b)


# The defaults repeat the schema's: a Python kernel receives only the arguments the caller passed.
@custom_op(_MATMUL.qualname, mutates_args=(), schema=_MATMUL.signature)
def matmul(a, b, block_sizes=None, autotune=True, allow_tf32=False):
    _check_operands(a, b)
    return _matmul_impl(a, b, block_sizes, autotune, allow_tf32)


def call_matmul(a, b, block_sizes=None, autotune=True, allow_tf32=False):
    """diyflash::matmul for the Python API: the implementation itself when no tracer, mode, subclass or
    autograd could see the op (ops/eager.py), else the op through the dispatcher."""
    refuse_forward_ad("matmul", a, b)
    if dispatcher_free(a, b):
        return _matmul_impl(a, b, block_sizes, autotune, allow_tf32)
    return torch.ops.diyflash.matmul(a, b, block_sizes, autotune, allow_tf32)


@matmul.register_fake
def _matmul_fake(a, b, block_sizes=None, autotune=True, allow_tf32=False):
    _check_operands(a, b)
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output):
    a, b, block_sizes, autotune, allow_tf32 = inputs
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    # dA needs only B and dB needs only A: keep nothing the requested gradients do not use
    ctx.save_for_backward(b if need_a else None, a if need_b else None)
    ctx.block_sizes, ctx.autotune, ctx.allow_tf32 = block_sizes, autotune, allow_tf32


def _backward_tiles(ctx, x, y) -> tuple[list[int] | None, bool]:
    """(block_sizes, autotune) of a gradient product x @ y: the forward's choice. Pinned tiles are kept
    where they are valid for the gradient's shapes (block sizes may not exceed a dimension's padded
    size); else, as after use_autotune=False, the untuned default tiles. Either way the backward is
    reproducible across processes when the forward was, and tunes nothing (dA and dB once
    autotuned even for pinned forwards)."""
    if ctx.block_sizes is None:
        return None, ctx.autotune
    from ..kernels.matmul_configs import manual_config

    try:
        manual_config(*ctx.block_sizes, x.shape[0], y.shape[1], x.shape[1], x.dtype, x.device)
    except ValueError:
        return None, False
    return list(ctx.block_sizes), False


def _backward(ctx, grad):
    b, a = ctx.saved_tensors
    da = db = None
    if ctx.needs_input_grad[0]:
        da = torch.ops.diyflash.matmul(grad, b.mT, *_backward_tiles(ctx, grad, b.mT), ctx.allow_tf32)
    if ctx.needs_input_grad[1]:
        db = torch.ops.diyflash.matmul(a.mT, grad, *_backward_tiles(ctx, a.mT, grad), ctx.allow_tf32)
    return da, db, None, None, None


matmul.register_autograd(_backward, setup_context=_setup_context)
guard_autograd(matmul)
register_autocast(matmul, cast=("a", "b"))
