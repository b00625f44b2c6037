"""Forward-mode AD is refused by every diyflash op, never answered with a zero tangent.

The ops have reverse-mode formulas only. PyTorch runs a custom op that has no forward formula as if its
inputs had no tangents: torch.func.jvp (and jacfwd, hessian) got an all-zero tangent and a dual tensor
(torch.autograd.forward_ad) an output without one, silently (matmul and attention_fwd called
by name once did; the attention API refused). Two places check:
- `refuse_forward_ad`, called by the Python API before its eager shortcuts (which skip the dispatcher);
- `guard_autograd`, which wraps each custom op's own autograd kernel, so that the ops called by name
  refuse too. The wrapper is registered on the AutogradCPU and AutogradCUDA keys, which take precedence
  over the `Autograd` alias kernel that torch.library.custom_op registers (no override of it, no
  warning); it calls that same kernel, built by torch's own make_autograd_impl, for everything else.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as forward_ad
from torch.library import Library

MESSAGE = ("diyflash::{op} has no forward-mode derivative (torch.func.jvp, jacfwd, hessian, "
           "torch.autograd.forward_ad): use reverse mode (.backward() or torch.autograd.grad)")


def _has_tangent(tensors) -> bool:
    # forward_ad._current_level is -1 unless a dual level (or a functorch jvp, which uses one) is open:
    # one integer comparison on every ordinary call
    if forward_ad._current_level < 0:
        return False
    return any(isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def refuse_forward_ad(op: str, *tensors) -> None:
    """Raise NotImplementedError when any input carries a forward-mode tangent, or a functorch jvp
    transform is active. Code being compiled skips it (Dynamo would break the graph on the functorch
    interpreter stack; a compiled graph records the op, whose autograd kernel checks again)."""
    if torch.compiler.is_compiling():
        return
    jvp = False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        jvp = any(i.key() == torch._C._functorch.TransformType.Jvp for i in retrieve_all_functorch_interpreters())
    if jvp or _has_tangent(tensors):
        raise NotImplementedError(MESSAGE.format(op=op))


_LIBS: list[Library] = []  # kept alive: dropping a Library deregisters its kernels


def guard_autograd(opdef) -> None:
    """Wrap the autograd kernel of a torch.library.custom_op (after its register_autograd, or without
    one) so that a forward-mode tangent on any input raises instead of vanishing."""
    from torch._library.autograd import make_autograd_impl

    op = opdef._opoverload
    inner = make_autograd_impl(op, opdef)  # the kernel custom_op registered, reading opdef's formulas
    label = op._opname

    def kernel(keyset, *args, **kwargs):
        if _has_tangent(args):
            raise NotImplementedError(MESSAGE.format(op=label))
        return inner(keyset, *args, **kwargs)

    lib = Library(op._namespace, "FRAGMENT")
    for key in ("AutogradCPU", "AutogradCUDA"):
        lib.impl(op._opname, kernel, key, with_keyset=True)
    _LIBS.append(lib)
