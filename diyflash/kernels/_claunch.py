"""A C launcher for bound launches (_launch.BoundLaunch): the kernel's parameters packed once, one C call a launch.

Triton's launcher (`CompiledKernel.run`) parses every argument from Python on each launch, asks the
driver about each pointer (cuPointerGetAttribute) and allocates the global scratch through a Python
closure. A bound launch repeats the same arguments but its pointers, so `_claunch.c` packs the
parameters once (`make`) and a launch writes the pointers into them and calls cuLaunchKernel (`launch`;
`launch_with` also writes new scalars: a decode step's lengths and strides).

The C source is compiled at first use with the system compiler, through Triton's own helper (as Triton
builds its launchers: its cache directory, no CUDA toolkit; libcuda is opened at run time). Where no
compiler is found, the build fails, libcuda is missing, or DIYFLASH_C_LAUNCHER=0 (read when diyflash is
imported), `module()` is None and every launch goes through Triton's launcher: the pure-Python path, with
the same results. A host TMA descriptor (the Hopper kernels' q, k, v, ...) is encoded into its tensor map
once, when the launch is made (cuTensorMapEncodeTiled with what Triton's launcher encodes at every launch),
and a launch passing another tensor of the same shape only replaces the map's address
(cuTensorMapReplaceAddress). A kernel whose parameters this launcher does not pack (descriptors the kernel
reads as pointers, fp4-padded ones, clusters, cooperative or PDL launches, a profiler's scratch) keeps
Triton's launcher too (`make` returns None).
"""

from __future__ import annotations

from pathlib import Path

from ._runtime import PLAIN, env_flag

ENABLED = not PLAIN and env_flag("DIYFLASH_C_LAUNCHER", "1")
SOURCE = Path(__file__).with_name("_claunch.c")

# Triton's signature types -> the C launcher's parameter codes (Triton's launcher packs the same C types)
_CODES = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H", "u32": "I",
          "u64": "Q", "fp16": "e", "bf16": "E", "fp32": "f", "f32": "f", "fp64": "d", "constexpr": "x"}

_state: dict = {}  # "module": the loaded module or None; "error": why it is None


def module():
    """The compiled launcher module (built and loaded once per process), or None where it cannot be used
    (DIYFLASH_C_LAUNCHER=0, DIYFLASH_PLAIN=1, no compiler, no libcuda): `reason()` says why."""
    if "module" in _state:
        return _state["module"]
    mod = None
    if not ENABLED:
        _state["error"] = "off (DIYFLASH_C_LAUNCHER=0 or DIYFLASH_PLAIN=1)"
    else:
        try:
            mod = build()
            if not mod.load():
                _state["error"], mod = "libcuda.so.1 not found", None
        except Exception as exc:  # no compiler, no Python headers, a failed build: Triton's launcher serves
            _state["error"] = f"{type(exc).__name__}: {exc}"
    _state["module"] = mod
    return mod


def reason() -> str | None:
    """Why module() is None (after a call of it), else None."""
    return _state.get("error")


def build():
    """Compile and load _claunch.c (Triton's compile_module_from_src keeps the built module in its cache)."""
    from triton.runtime.build import compile_module_from_src

    return compile_module_from_src(src=SOURCE.read_text(), name="diyflash_claunch")


def codes(compiled) -> str | None:
    """The C launcher's parameter codes for a compiled kernel, one per argument in order ('p' a pointer,
    'x' a constexpr, 'T' a host TMA descriptor that the kernel reads as a tensor map), or None where it does
    not pack this kernel's launch (see the module's docstring)."""
    try:
        signature = list(compiled.src.signature.values())
        meta = compiled.metadata
        if (getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False)
                or getattr(meta, "launch_pdl", False) or getattr(meta, "profile_scratch_size", 0)):
            return None
        maps = list(getattr(meta, "tensordesc_meta", None) or ())
    except AttributeError:  # a Triton whose compiled kernels look different
        return None
    out = []
    for ty in signature:
        if not isinstance(ty, str):
            return None  # a tuple argument
        if ty.startswith("tensordesc"):
            spec = maps.pop(0) if maps else None
            if not isinstance(spec, dict) or spec.get("fp4_padded") or not _maps_here():
                return None  # lowered to a pointer, shape and strides; fp4 padding; no tensor-map entry points
            out.append("T")
            continue
        code = "p" if ty.startswith("*") else _CODES.get(ty)
        if code is None:
            return None
        out.append(code)
    return "".join(out)


def _maps_here() -> bool:
    mod = module()
    return mod is not None and mod.tma()


# Triton's element types of a tensor map (the device's numbering) -> the host enum cuTensorMapEncodeTiled takes
# (Triton's launcher translates them alike, TMA_DTYPE_DEVICE_TO_HOST)
_MAP_TYPES = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}


def map_specs(compiled, kinds: str, values: tuple) -> tuple:
    """What the C launcher encodes each host TMA descriptor ('T') of a launch with, as Triton's launcher calls
    fill_tma_descriptor: (swizzle, element size, host element type, block shape, 1 for NaN padding)."""
    maps = iter(compiled.metadata.tensordesc_meta)
    return tuple((spec["swizzle"], spec["elem_size"], _MAP_TYPES[spec["elem_type"]], tuple(spec["block_size"]),
                  int(getattr(value, "padding", "zero") == "nan"))
                 for spec, value in ((next(maps), value) for code, value in zip(kinds, values) if code == "T"))


def make(compiled, grid: tuple, values: tuple, npointers: int, nargs: int):
    """A packed launch of `compiled` over `grid` with these argument values (its parameters in order, the
    first `npointers` the open pointers, the `nargs` after them the scalars launch_with may replace), or
    None where the C launcher is not used for it. Tensors among values are packed by data_ptr()."""
    mod = module()
    if mod is None:
        return None
    kinds = codes(compiled)
    if kinds is None or len(kinds) != len(values):
        return None
    meta = compiled.metadata
    g0, g1, g2 = (*grid, 1, 1)[:3]
    params = (compiled.function, (g0, g1, g2), 32 * meta.num_warps, meta.shared, kinds, tuple(values), npointers,
              nargs)
    if "T" not in kinds:
        return mod.make(*params)
    try:  # a descriptor the driver will not encode here (it says why to Triton's launcher, which then runs it)
        return mod.make(*params, map_specs(compiled, kinds, values))
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError):
        return None


def scratch_bytes(compiled, grid: tuple) -> int:
    """The global scratch a launch of `compiled` over `grid` needs (Triton's rule: per program, per CTA)."""
    g0, g1, g2 = (*grid, 1, 1)[:3]
    size = getattr(compiled.metadata, "global_scratch_size", 0)
    return g0 * g1 * g2 * getattr(compiled.metadata, "num_ctas", 1) * size if size else 0
