"""Autocast for every diyflash op, the way PyTorch treats SDPA and matmul.

Under `torch.autocast(device, dtype)` an op casts its floating inputs (not float64, which autocast
never touches) to the autocast dtype and runs its fp16/bf16 kernels, so an AMP training loop with fp32
activations gets the fast kernels, as SDPA and torch.matmul do there. The row statistics (lse, dlse)
stay fp32. Without these kernels, attention and matmul ran the slow IEEE-fp32 kernels under
CUDA autocast, the CPU PyTorch path computed in bf16 but returned fp32, and matmul's eager result under
autocast (bf16) disagreed with its fake (fp32), so eager and compiled disagreed.

Each op gets a kernel on the AutocastCPU and AutocastCUDA keys (and the same function as its Python
kernel for those keys, which tracing uses), as torch.library.register_autocast registers one, except
that the target dtype is the autocast's own (register_autocast casts to one fixed dtype).
"""

from __future__ import annotations

import torch
from torch.library import Library

_LIBS: list[Library] = []  # kept alive: dropping a Library deregisters its kernels


def _cast(x, device_type: str, dtype: torch.dtype):
    if (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64
            and x.device.type == device_type):
        return x.to(dtype)
    return x


def register_autocast(opdef, cast: tuple[str, ...]) -> None:
    """Autocast kernels for the custom op `opdef`: the arguments named in `cast` are cast to the autocast
    dtype of their device, every other argument passes unchanged."""
    op = opdef._opoverload
    names = [a.name for a in op._schema.arguments]
    positions = [names.index(name) for name in cast]
    lib = Library(op._namespace, "FRAGMENT")
    for device_type, key_name in (("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")):
        key = getattr(torch._C.DispatchKey, key_name)

        def autocast_impl(*args, _device_type=device_type, _key=key):
            dtype = torch.get_autocast_dtype(_device_type)
            args = list(args)
            for i in positions:
                if i < len(args):
                    args[i] = _cast(args[i], _device_type, dtype)
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_key)):
                return op(*args)

        def kernel(_keyset, *args, _impl=autocast_impl):
            return _impl(*args)

        if op.has_kernel_for_dispatch_key(key):
            op.py_kernels.pop(key, None)
        op.py_impl(key)(autocast_impl)
        lib.impl(op._opname, kernel, key_name, with_keyset=True)
    _LIBS.append(lib)
