"""When the public API may call an op's implementation directly instead of going through the dispatcher.

A custom op's eager dispatch costs ~25-35 us of host time per call on the GPU machine
(`bench/overhead.py`): more than the GPU needs for a 1024^3 matmul or a short attention. When nothing
can observe the difference, `diyflash.flash_attention` and `diyflash.triton_matmul` skip it and call
the same implementation function the op's CUDA/CPU kernel calls, so the result is bit-identical.

Nothing observes it when all of these hold (each check costs well under a microsecond):
- no tracer: not compiling, exporting or torch.jit-tracing (those must record `diyflash::*`);
- no autograd: grad mode is off or no input requires grad (with grad the op's autograd formula runs;
  `dispatcher_free(..., autograd=True)` drops this one for the attention, which then runs that formula
  in a plain autograd.Function, ops/attention.py `_EagerAttention`);
- no torch-function or torch-dispatch mode (FakeTensorMode, FlopCounterMode, functionalization, ...)
  and no functorch transform (vmap, grad);
- every tensor is a plain torch.Tensor or nn.Parameter (subclasses dispatch through the op);
- the autograd profiler is off (a profile should show `diyflash::*`, not just the Triton kernel);
- autocast is off (under autocast the ops' autocast kernels cast the inputs first: ops/autocast.py).

`torch.ops.diyflash.*` called by name always dispatches; only the Python API takes the shortcut, and
the attention's autograd formula, whose eager backward calls the backward implementation the same way
(autograd's grad mode is off there unless a double backward is being built, which must see the op).
"""

from __future__ import annotations

import torch

from ..kernels._runtime import PLAIN

PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)  # exactly these types: subclasses dispatch through the op


def op_observed() -> bool:
    """Whether something could see the op being skipped: DIYFLASH_PLAIN, a tracer, a mode, a functorch
    transform, the autograd profiler or autocast (the conditions above but the tensors' own)."""
    return bool(
        PLAIN  # DIYFLASH_PLAIN=1: always the op
        or torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or torch.jit.is_tracing()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._functorch.peek_interpreter_stack() is not None
        or torch.autograd._profiler_enabled()
        or torch._C._is_any_autocast_enabled()  # the ops' autocast kernels cast the inputs (ops/autocast.py)
    )


DISPATCH, DIRECT, DIRECT_WITH_AUTOGRAD = 0, 1, 2  # eager_route's answers


def eager_route(*tensors: torch.Tensor | None) -> int:
    """DIRECT where calling the implementation directly is indistinguishable from calling the op;
    DIRECT_WITH_AUTOGRAD where it would be but for autograd (grad mode on and some tensor requires grad:
    a caller running the op's autograd formula itself may still skip the dispatch); else DISPATCH.
    (One pass over the checks for callers that take either shortcut.)"""
    if op_observed():
        return DISPATCH
    grad = torch.is_grad_enabled()
    route = DIRECT
    for t in tensors:
        if t is None:
            continue
        if type(t) not in PLAIN_TYPES:
            return DISPATCH
        if grad and t.requires_grad:
            route = DIRECT_WITH_AUTOGRAD
    return route


def dispatcher_free(*tensors: torch.Tensor | None, autograd: bool = False) -> bool:
    """True when calling the implementation directly is indistinguishable from calling the op.
    autograd=True drops the "no autograd" condition: for callers that skip only a composite op's
    own dispatch and call the op it lowers to, whose autograd formula still runs."""
    route = eager_route(*tensors)
    return route == DIRECT or (autograd and route == DIRECT_WITH_AUTOGRAD)
