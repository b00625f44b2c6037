"""Where a kernel runs: Triton on CUDA, Triton's interpreter on CPU, or the PyTorch path.

Nothing here imports triton: a CPU-only machine without triton must still import diyflash and run
the PyTorch implementation. Triton is imported the first time a Triton kernel is needed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from typing import Callable, Iterable, NamedTuple

import torch

# Triton decides interpreter-or-compiler when `@triton.jit` executes, from TRITON_INTERPRET read by its
# own knob (triton.knobs.runtime.interpret); for its own standard library (tl.max's combine function,
# tl.cdiv, ...) that is when triton.language is first imported. So TRITON_INTERPRET must be set before
# triton is imported (torch may import it), i.e. before the process imports torch.
_TRUTHY = ("1", "true", "yes", "on", "y")  # Triton's spelling rules, for machines where triton is missing


def env_flag(name: str, default: str = "0") -> bool:
    """An environment switch read by Triton's spelling rules (1, true, yes, on, y)."""
    return os.environ.get(name, default).strip().lower() in _TRUTHY


# DIYFLASH_PLAIN=1 (read once, when diyflash is imported): every host-speed shortcut off at once, the plain
# path for debugging: each API call dispatches through its op (ops/eager.dispatcher_free), no launch plan
# is kept or replayed, no compiled kernel is bound (every launch through Triton's JIT), no decode buffer is
# kept between calls; the matmul's tuned choices stay (a choice, not a shortcut). The same kernels, the
# same results.
PLAIN = env_flag("DIYFLASH_PLAIN")


# -- What the launchers keep between calls (plans, bound kernels, kept buffers, key classes): one eviction
# rule (remember) and one registry (keep), behind diyflash.cache_info() and diyflash.clear_caches(). --

MAX_ENTRIES = 4096  # per store: a workload with ever-new shapes starts over instead of growing


def remember(store: dict, key, value, limit: int = MAX_ENTRIES):
    """store[key] = value, where a full store (limit entries) starts over first instead of growing: a
    workload with ever-new shapes, streams or threads pays a new plan, never unbounded memory. Returns value."""
    if key not in store and len(store) >= limit:
        store.clear()
    store[key] = value
    return value


_KEPT_KINDS: dict[str, tuple[Callable[[], Iterable[dict]], tuple[str, Callable[[Iterable[dict]], int]] | None]] = {}


def keep(kind: str, stores: Callable[[], Iterable[dict]], measure: tuple[str, Callable] | None = None) -> None:
    """Register what a module keeps between calls: `kind` names it in cache_info, stores() returns its dicts
    (called each time, so a store rebound later is the one counted and cleared), measure = (name, fn) adds
    a second number (the kept buffers' bytes). A module not imported has nothing kept and is not asked."""
    _KEPT_KINDS[kind] = (stores, measure)


def cache_info() -> dict[str, int]:
    """What the launchers keep between calls, by kind: entries (and the kept buffers' bytes)."""
    info: dict[str, int] = {}
    for kind, (stores, measure) in _KEPT_KINDS.items():
        found = list(stores())
        info[kind] = sum(len(s) for s in found)
        if measure is not None:
            info[measure[0]] = measure[1](found)
    return info


def clear_caches() -> None:
    """Forget everything the launchers keep between calls (compiled binaries stay in Triton's caches and tuned
    choices in the tuner's disk cache). A kept buffer's memory returns to PyTorch's caching allocator once no
    launch in flight uses it: launches on a stream run in order, and a freed block is reused on its own
    stream only."""
    for stores, _ in _KEPT_KINDS.values():
        for s in stores():
            s.clear()


@functools.cache
def _triton_knobs():
    """triton.knobs where triton imports, else None (the PyTorch path needs no triton)."""
    try:
        return importlib.import_module("triton.knobs")
    except ImportError:
        return None


def interpreter_active() -> bool:
    """True when TRITON_INTERPRET asks Triton to run kernels on CPU tensors through its interpreter,
    read by Triton's own knob, so that diyflash and Triton never disagree (" yes " with spaces: Triton
    says no, and so does this). Without triton, and while Dynamo traces, the same rules applied here."""
    if not torch.compiler.is_compiling():  # Dynamo cannot trace the import: there, the same rules by hand
        knobs = _triton_knobs()
        if knobs is not None:
            return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in _TRUTHY


def uses_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernels serve this tensor (CUDA, or CPU under the interpreter).

    float64 always takes the PyTorch path: it exists for gradcheck, not for speed.
    """
    if t.dtype == torch.float64:
        return False
    return t.is_cuda or (t.device.type == "cpu" and interpreter_active())


def require_triton():
    """Import triton, or raise the error table's ModuleNotFoundError ("triton is required") when triton
    itself is absent. When triton is installed but fails to import (e.g. its interpreter needs numpy,
    which neither torch nor triton declares), the error names the real cause and how to fix it."""
    try:
        return importlib.import_module("triton")
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing == "triton" or missing.startswith("triton."):
            raise ModuleNotFoundError(
                "triton is required to run diyflash's kernels (on CUDA tensors, or on CPU tensors under "
                "TRITON_INTERPRET=1), but it is not installed: pip install 'triton>=3.6'", name="triton"
            ) from e
        mode = " (TRITON_INTERPRET=1: Triton's interpreter imports it)" if interpreter_active() else ""
        raise ModuleNotFoundError(
            f"triton is installed but cannot be imported: it needs the module {missing!r}, which is missing"
            f"{mode}. Install it (pip install {missing.split('.')[0]}), or reinstall diyflash, which "
            "declares it", name=missing,
        ) from e


def device_guard(t: torch.Tensor):
    """A context that makes t's CUDA device the current one while kernels launch (Triton launches on the
    current device, on its current stream): inputs on cuda:1 while cuda:0 is current ran on GPU 0, or
    failed with "Pointer argument cannot be accessed from Triton". A no-op context where t
    already is on the current device, or not on a GPU (~1 us)."""
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


class DeviceLimits(NamedTuple):
    smem: int | None  # shared memory per block (opt-in maximum); None: no limit (the interpreter)
    tma: bool  # tensor descriptors / TMA exist
    sms: int | None  # streaming multiprocessors; None: not a GPU


@functools.cache
def device_limits(device: torch.device) -> DeviceLimits:
    """What the launchers size their work to on a device. Cached: launchers ask on every call, and the
    device-properties query costs microseconds."""
    if device.type != "cuda":
        return DeviceLimits(None, True, None)  # the interpreter runs tensor descriptors on CPU tensors
    props = torch.cuda.get_device_properties(device)
    return DeviceLimits(getattr(props, "shared_memory_per_block_optin", None), props.major >= 9,
                        props.multi_processor_count)
