"""Launching a compiled Triton kernel without the JIT's per-call binding.

`kernel[grid](*args, **meta)` binds every argument, computes Triton's specialization of each (dtype
and 16-byte alignment of pointers, divisibility of integers), hashes a cache key and checks the
kernel's globals on every call. On an H200 host (Triton 3.6), launching the matmul kernel that way
took 27 us of host time against 8 us for calling the compiled kernel directly: more than the GPU
needs for a 1024^3 matmul or a short attention, and the attention backward launches three kernels.

`DirectLauncher(kernel)` does that work once per *call signature*. The first launch with a signature
goes through the JIT (compiling if needed) and keeps the CompiledKernel it returns: compiled without a
launch and launched by the C launcher where that packs the kernel (Triton's own launcher, a C build of its
own with empty caches, is then built only if something calls it: load_without_launcher), else through
`kernel[grid]`; a later launch with the same signature calls that kernel's `run` with exactly what the JIT
would pass it.

The signature covers everything Triton specializes on, so a hit runs the kernel the JIT would pick:
- a tensor contributes its dtype and whether its address is 16-byte aligned (what Triton reads);
- a tensor descriptor: its dtype, shape, strides, block shape, padding and base alignment;
- an int its class as Triton specializes it (== 1, a multiple of 16, 32- or 64-bit or unsigned; `int_class`),
  not its value: a decode step against a cache one token longer (new lengths and strides, the same
  classes) launches directly, where a key of exact values sent every step of a growing cache (transformers'
  DynamicCache) through the JIT again;
- any other argument (floats, bools, strings, constexprs, None) its value;
- the launch options (num_warps, ...), the current device and the JIT's debug/instrumentation knobs.
Launch hooks (e.g. a profiler's) are passed on exactly as the JIT does; a kernel with pre-run hooks
always goes through the JIT. Under TRITON_INTERPRET=1 there is no compiled kernel: every launch goes
through the interpreter; under DIYFLASH_PLAIN=1 every launch goes through the JIT (nothing is bound).

`launcher.compile_ahead(grid, args, meta)` starts compiling a launch's kernel on a worker thread and returns at
once; the launch with that signature later waits for it instead of compiling (_compile.py).

`launcher.bind(grid, pointers, args, meta)` goes one step further for callers that repeat a whole call:
it returns the compiled kernel with everything but the leading pointer arguments fixed (a
BoundLaunch), which the caller keeps in its own cache keyed on what the signature depends on (the
attention launchers key on the inputs' dtypes, shapes, strides and alignment). Calling it costs the
launch alone: one call of the C launcher (_claunch: the parameters packed when bound) where it is built,
else Triton's launcher; `run_bound` runs a plan's bound launches with one stream, hook and scratch lookup.
"""

from __future__ import annotations

import concurrent.futures
import operator
import threading
from typing import Callable, NamedTuple

import torch
import triton
from triton import knobs
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from ._claunch import codes, make as pack_launch, module as c_launcher, scratch_bytes
from ._compile import compile_ahead_on, settle_hashes, submit
from ._runtime import MAX_ENTRIES, PLAIN, keep, remember

try:  # where Triton keeps the scratch allocator its launcher calls (the C launcher calls the same one)
    from triton.runtime import _allocation
except ImportError:
    _allocation = None


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids. (triton.cdiv is a constexpr function: ~1 us per call from Python.)"""
    return -(-a // b)


_SCRATCH: dict[tuple, torch.Tensor] = {}  # (device, stream) -> the scratch its launches share (_scratch)
keep("launch scratch", lambda: (_SCRATCH,), ("launch scratch bytes", lambda stores: sum(
    t.numel() for store in stores for t in store.values())))


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory for a launch's device-built TMA descriptors, asked for per launch: by the C launches
    directly, by Triton's launcher through the allocator ensure_scratch_allocator installs. The launches of
    one stream run one after another, so one buffer per (device, stream), grown to the largest launch's need,
    serves them all: no allocation per launch (a bf16 forward made two). While a CUDA graph is being captured
    each launch gets its own (a replay may run beside other work on that buffer's stream). torch.empty's
    allocations are 256-byte aligned."""
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.empty(size, dtype=torch.int8, device="cuda")
    key = (torch._C._cuda_getDevice(), stream)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < size:
        buf = remember(_SCRATCH, key, torch.empty(size, dtype=torch.int8, device="cuda"))
    return buf


def ensure_scratch_allocator() -> None:
    """Kernels that build TMA descriptors on the device need global scratch memory at launch, which
    Triton asks of the allocator set with `triton.set_allocator` (a context variable: per thread, so
    autograd's backward thread starts without one). Install a torch-backed allocator where none is
    set; an allocator set before is kept (torch.compile's kernels set inductor's in the thread that runs them),
    and only Triton's launcher, diyflash's fallback, uses it: the C launches take _scratch's buffer."""
    try:  # Triton keeps "none set" private; if that ever moves, install ours (it works the same)
        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except AttributeError:
        unset = True
    if unset:
        triton.set_allocator(_scratch)


# Triton's interpreter keeps global state while it runs a grid (the program ids, the grid dimensions):
# two threads interpreting at once raised InterpreterError('x >= grid_dim[0]') or gave other bits.
# Interpreted launches take this lock, one at a time; compiled launches never do.
INTERPRETER_LOCK = threading.Lock()

MAX_SIGNATURES = MAX_ENTRIES  # per kernel (_runtime.remember: a full store starts over)


_SCALARS = frozenset({float, bool, str, type(None)})  # their value is their key (ints: int_class)
_INT_KEYS = tuple(("int", c) for c in range(16))  # one tuple per class: a key costs no allocation


def int_class(x: int) -> tuple:
    """What Triton's specialization reads of an int argument: whether it is 1 (a constexpr then), a
    multiple of 16, and its type (i32 within [-2^31, 2^31), u64 from 2^63, else i64). Two ints of one class
    run the same compiled kernel (tests/test_launch.py checks this against Triton's own specialization)."""
    cls = (x == 1) | (x % 16 == 0) << 1
    if not -2**31 <= x < 2**31:
        cls |= 8 if x >= 2**63 else 4
    return _INT_KEYS[cls]


def _arg_key(x):
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if isinstance(x, TensorDescriptor):
        return (x.base.dtype, tuple(x.shape), tuple(x.strides), tuple(x.block_shape), x.padding,
                x.base.data_ptr() % 16 == 0)
    if hasattr(x, "layout") and hasattr(x, "block_shape"):  # Gluon's descriptor: its shared layout too
        return (x.base.dtype, tuple(x.shape), tuple(x.strides), tuple(x.block_shape), x.layout,
                x.base.data_ptr() % 16 == 0)
    return x


def active_driver():
    """Triton's own (get_current_device, get_current_stream): the JIT launches on these."""
    from triton.runtime import driver

    return driver.active.get_current_device, driver.active.get_current_stream


_STREAM: list = []


def current_stream(index: int) -> int:
    """The current CUDA stream's handle on device `index`, by Triton's driver (~0.1 us, where
    torch.cuda.current_stream() costs ~8 us of the H200 host's time)."""
    if not _STREAM:
        _STREAM.append(active_driver()[1])
    return _STREAM[0](index)


def compiled(kernel) -> bool:
    """Whether @triton.jit made `kernel` a compiled kernel (else the interpreter runs it): Triton decides
    when the decorator runs, so this is fixed per kernel."""
    return isinstance(kernel, JITFunction)


class DirectLauncher:
    """`launcher(grid, *args, **meta)` == `kernel[grid](*args, **meta)`, minus the JIT's per-call work
    after the first launch with each signature. `args` are the kernel's leading parameters; `meta`
    names every remaining one (constexprs) plus launch options such as num_warps."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.interpreted = not compiled(kernel)
        self.direct_launches = 0  # tests read this to see that the direct path ran
        self._compiled: dict[tuple, tuple] = {}
        self._driver = None  # Triton's (get_current_device, get_current_stream), once a kernel compiled
        self._pending: dict[tuple, concurrent.futures.Future] = {}  # signature -> its compile ahead
        # a constexpr passed positionally is keyed by its value: from the first one on, args are keyed exactly
        self._classes_below = min(getattr(kernel, "constexprs", None) or [1 << 30])

    def clear(self) -> None:
        """Forget the bound kernels: the next call of each signature binds again through the JIT (the
        compiled binaries stay in Triton's caches)."""
        self._compiled.clear()
        self._pending.clear()

    def _signature(self, device, args, meta) -> tuple:
        # the names of meta keep the call site's order: (BLOCK_M=64, BLOCK_N=128) != (BLOCK_N=64, BLOCK_M=128)
        args_key = [int_class(x) if type(x) is int else x if type(x) in _SCALARS else _arg_key(x) for x in args]
        if len(args) > self._classes_below:
            args_key[self._classes_below:] = [x if type(x) in _SCALARS or type(x) is int else _arg_key(x)
                                              for x in args[self._classes_below:]]
        return (device, tuple(meta), *meta.values(), *args_key, *runtime_key())

    def __call__(self, grid, *args, **meta) -> None:
        if self._driver is not None and not self.kernel.pre_run_hooks:
            get_device, get_stream = self._driver
            device = get_device()
            hit = self._compiled.get(self._signature(device, args, meta))
            if hit is not None:
                compiled, constexpr_names = hit
                _run(compiled, grid, get_stream(device), (*args, *(meta[name] for name in constexpr_names)))
                self.direct_launches += 1
                return
        self._jit_launch(grid, args, meta)

    def compile_ahead(self, grid, args: tuple, meta: dict) -> bool:
        """Start compiling the kernel of this launch (`launcher(grid, *args, **meta)`) on a worker thread and
        return: the launch with this signature then waits for that compile instead of starting its own. Tensor
        arguments are read for their dtype and 16-byte alignment only, so tensors on the meta device stand for
        outputs not allocated yet. False where nothing was started: the kernel is bound or pending already, the
        interpreter or DIYFLASH_PLAIN runs it, DIYFLASH_COMPILE_AHEAD=0, or a kernel with pre-run hooks."""
        if not compile_ahead_on() or self.interpreted or self.kernel.pre_run_hooks:
            return False
        if self._driver is None:
            self._driver = active_driver()
        device = self._driver[0]()
        signature = self._signature(device, args, meta)
        if signature in self._compiled or signature in self._pending:
            return False
        caches = getattr(self.kernel, "device_caches", None)
        if caches is not None:
            caches[device]  # the JIT's per-device cache made here, not raced by the worker and a launch
        settle_hashes()
        getattr(self.kernel, "cache_key", None)  # its source hash computed here too, not on the worker thread
        remember(self._pending, signature, submit(self.kernel, device, grid, tuple(args), dict(meta)), MAX_SIGNATURES)
        return True

    def bind(self, grid, pointers: tuple, args: tuple, meta: dict) -> BoundLaunch | None:
        """This launch with its leading pointer arguments left open: `bound(*pointers)` later runs the
        kernel compiled for this signature with other tensors in those places. The caller guarantees
        that they share what Triton specializes tensors on (dtype, 16-byte alignment). None where no
        compiled kernel exists for the signature yet (no launch with it so far, or the interpreter)."""
        if self._driver is None or self.kernel.pre_run_hooks:
            return None
        get_device, get_stream = self._driver
        device = get_device()
        hit = self._compiled.get(self._signature(device, (*pointers, *args), meta))
        if hit is None:
            return None
        compiled, constexpr_names = hit
        tail = (*args, *(meta[name] for name in constexpr_names))
        return BoundLaunch(self, compiled, tuple(grid), device, args, meta, tail, pointers)

    def _jit_launch(self, grid, args, meta) -> None:
        if not self.interpreted:
            settle_hashes()
        if self._pending:  # its compile ahead, finished first: the JIT below then finds the kernel in its cache
            pending = self._pending.pop(self._signature(self._driver[0](), args, meta), None)
            if pending is not None:
                pending.result()
        compiled = None if self.interpreted else self._c_first_launch(grid, args, meta)
        if compiled is None:
            if self.interpreted:
                with INTERPRETER_LOCK:
                    compiled = self.kernel[grid](*args, **meta)
            else:
                compiled = self.kernel[grid](*args, **meta)
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        if PLAIN or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata", "launch_metadata")):
            return  # DIYFLASH_PLAIN=1, the interpreter, or a Triton whose compiled kernels look different: JIT every time
        names = self._meta_names(args, meta)
        if names is None:
            return  # a defaulted parameter: the JIT fills it in, so keep going through the JIT
        if self._driver is None:
            self._driver = active_driver()
        signature = self._signature(self._driver[0](), args, meta)
        remember(self._compiled, signature, (compiled, names), MAX_SIGNATURES)

    def _meta_names(self, args, meta) -> tuple | None:
        """The kernel's parameters after the positional args, in order, where meta names each of them; None
        where one is left to its default (the JIT fills it in)."""
        names = tuple(self.kernel.arg_names[len(args):])
        return names if all(name in meta for name in names) else None

    def _c_first_launch(self, grid, args, meta):
        """A signature's first launch through the C launcher where it packs the kernel: compiled by the JIT
        without launching (warmup), its module loaded without Triton's launcher (load_without_launcher) and
        launched; the compiled kernel, or None where nothing was launched (the JIT then launches it)."""
        kernel = self.kernel
        if PLAIN or kernel.pre_run_hooks or not _c_on() or c_launcher() is None:
            return None
        names = self._meta_names(args, meta)
        if names is None:
            return None
        compiled = kernel.warmup(*args, grid=grid, **meta)
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        if compiled is None or codes(compiled) is None or not load_without_launcher(compiled):
            return None
        if self._driver is None:
            self._driver = active_driver()
        device = self._driver[0]()
        bound = BoundLaunch(self, compiled, tuple(grid), device, tuple(args), meta,
                            (*args, *(meta[name] for name in names)), ())
        if bound.packed is None or not _c_launch(bound, self._driver[1](device), (), None):
            return None
        return compiled


def load_without_launcher(compiled) -> bool:
    """Load a compiled kernel's module as CompiledKernel._init_handles does, but leave Triton's launcher unbuilt
    until something calls it (_LazyLauncher): the C launcher launches it. With empty caches each of Triton's
    launchers is a C build of ~0.34 s: the first forward + backward (B4 H16 N4096 D128 causal fp16, H200) 9.0 ->
    8.6 s, two builds fewer (bench/results/coldstart_lazy_launchers_h200.jsonl). False (nothing loaded) where a
    kernel-load hook is set or the kernel does not fit the device: _init_handles then loads it, raising its errors."""
    if compiled.module is not None:
        return True
    from triton.runtime import driver

    runtime = knobs.runtime
    if (_hook(getattr(runtime, "kernel_load_start_hook", None)) is not None
            or _hook(getattr(runtime, "kernel_load_end_hook", None)) is not None):
        return False
    utils = driver.active.utils
    device = driver.active.get_current_device()
    meta = compiled.metadata
    if meta.shared > utils.get_device_properties(device)["max_shared_mem"] or getattr(meta, "tmem_size", None):
        return False
    module, function, n_regs, n_spills, n_max_threads = utils.load_binary(compiled.name, compiled.kernel, meta.shared,
                                                                          device)
    if meta.num_warps * driver.active.get_current_target().warp_size > n_max_threads:
        return False
    compiled._run = _LazyLauncher(compiled)
    compiled.module, compiled.function, compiled.n_regs, compiled.n_spills, compiled.n_max_threads = (
        module, function, n_regs, n_spills, n_max_threads)
    return True


class _LazyLauncher:
    """A compiled kernel's `run` until it is first called: then Triton's launcher is built, takes its place
    and launches (the JIT, a hook set later, or the fallback of a launch the C launcher does not make)."""

    __slots__ = ("compiled", )

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, *args):
        from triton.runtime import driver

        run = self.compiled._run = driver.active.launcher_cls(self.compiled.src, self.compiled.metadata)
        return run(*args)


class BoundLaunch:
    """A compiled kernel, its grid and every argument after the leading pointers, fixed by
    `DirectLauncher.bind`. Calling it costs the launch itself: no signature is computed. A caller that
    repeats a whole sequence of launches (an attention backward is four) keeps these in a plan keyed
    on what the signatures depend on. Where the C launcher serves the kernel (_claunch), the arguments
    are packed once here and each launch is one C call; else (and while a launch hook is set) Triton's
    launcher runs it."""

    __slots__ = ("launcher", "compiled", "grid", "device", "args", "meta", "tail", "packed", "scratch", "align")

    def __init__(self, launcher, compiled, grid, device, args, meta, tail, pointers=None):
        self.launcher, self.compiled, self.grid, self.device = launcher, compiled, grid, device
        self.args, self.meta, self.tail = args, meta, tail
        self.packed = None if pointers is None else pack_launch(compiled, grid, (*pointers, *tail), len(pointers),
                                                                  len(args))
        self.scratch, self.align = 0, 1
        if self.packed is not None:  # Triton's launcher asks its allocator for these, the C launch _scratch
            self.scratch = scratch_bytes(compiled, grid)
            self.align = compiled.metadata.global_scratch_align

    def __call__(self, *pointers) -> None:
        launcher = self.launcher
        if launcher.kernel.pre_run_hooks:  # added since binding: only the JIT runs them
            launcher(self.grid, *pointers, *self.args, **self.meta)
            return
        stream = launcher._driver[1](self.device)
        if self.packed is None or not _c_launch(self, stream, pointers, None):
            _run(self.compiled, self.grid, stream, (*pointers, *self.tail))
        launcher.direct_launches += 1

    def run_with(self, pointers: tuple, args: tuple) -> None:
        """This launch with other arguments after the pointers, each of the class Triton specialized the
        bound one on (an int of the same `int_class`, any other scalar equal): the caller's key guarantees
        it, as a decode step's key does for a cache one token longer (kvcache.py). Costs the launch alone,
        like calling the bound launch: no signature is computed."""
        launcher = self.launcher
        if len(args) != len(self.args) or launcher.kernel.pre_run_hooks:  # hooks: only the JIT runs them
            launcher(self.grid, *pointers, *args, **self.meta)
            return
        stream = launcher._driver[1](self.device)
        if self.packed is None or not _c_launch(self, stream, pointers, args):
            _run(self.compiled, self.grid, stream, (*pointers, *args, *self.tail[len(self.args):]))
        launcher.direct_launches += 1


class Sequence(NamedTuple):
    """A plan's bound launches as one C call (the C launcher's launch_seq): the tensors they read, looked up
    in the call's env in one C call (`values`), each launch with the indices of its pointers among them."""

    values: Callable[[dict], tuple]  # env -> the pointer values, in the order of `names`
    names: tuple  # the env entries the launches read, each once
    tail: tuple  # (packed launch, indices of its pointers in values, whether it gets the scratch), flattened
    bounds: tuple  # the BoundLaunches, in order
    kernels: tuple  # their JIT kernels (a pre-run hook added since binding sends the plan through the JIT)
    need: int  # the global scratch bytes of the largest launch, and its alignment
    align: int


def sequence(bounds, pointer_names) -> Sequence | None:
    """The Sequence of these BoundLaunches, each reading the env entries `pointer_names[i]`; None where some
    launch is not packed for the C launcher (run_bound then goes launch by launch)."""
    if not bounds or any(b.packed is None for b in bounds):
        return None
    names: list[str] = []
    tail = []
    for bound, launch_names in zip(bounds, pointer_names):
        at = []
        for name in launch_names:
            if name not in names:
                names.append(name)
            at.append(names.index(name))
        tail += [bound.packed, tuple(at), bool(bound.scratch)]
    if len(names) > 1:
        values = operator.itemgetter(*names)
    else:  # (itemgetter of one name returns the value, not a tuple; of none it cannot be made)
        values = lambda env: tuple(env[name] for name in names)  # noqa: E731
    return Sequence(values, tuple(names), tuple(tail), tuple(bounds), tuple(b.launcher.kernel for b in bounds),
                    max(b.scratch for b in bounds), max(b.align for b in bounds))


def c_sequence_ok(seq: Sequence) -> bool:
    """Whether a Sequence may run as one C call now (run_bound's condition): the C launcher on, no launch hook
    set, and no pre-run hook added to its kernels since they were bound."""
    if not _c_on():
        return False
    for kernel in seq.kernels:
        if kernel.pre_run_hooks:
            return False
    return True


def run_bound(launches, env, args: list[tuple] | None = None, seq: Sequence | None = None) -> None:
    """A plan's bound launches ((BoundLaunch, env -> its pointers), ...) in order, their pointers looked up
    in env; with args, each with its own arguments after the pointers (BoundLaunch.run_with). Where every
    one is packed for the C launcher (and it is on, no launch hook is set), the stream, the hooks and the
    global scratch are looked up once for all of them (the launches of one stream run one after another, so
    one scratch buffer, the largest they need, serves each in turn), and with `seq` (the launches' Sequence)
    and no args they are one C call; else each launch decides alone."""
    if seq is not None and args is None and c_sequence_ok(seq):
        first = seq.bounds[0]
        stream = first.launcher._driver[1](first.device)
        scratch = _scratch(seq.need, seq.align, stream) if seq.need else None
        done = _c_fire_seq(c_launcher(), stream, scratch, seq.values(env), seq.tail)
        for bound in seq.bounds[:done]:
            bound.launcher.direct_launches += 1
        if done < len(seq.bounds):  # no current context on this thread: Triton's launcher makes one
            _each(launches[done:], env, None)
        return
    if (not _c_on() or not all(bound.packed is not None and not bound.launcher.kernel.pre_run_hooks
                               for bound, _ in launches)
            or (args is not None and not all(len(a) == len(b.args) for (b, _), a in zip(launches, args)))):
        _each(launches, env, args)
        return
    first = launches[0][0]
    stream = first.launcher._driver[1](first.device)
    need = max(bound.scratch for bound, _ in launches)
    scratch = _scratch(need, max(b.align for b, _ in launches), stream) if need else None
    mod = c_launcher()
    for i, (bound, pointers) in enumerate(launches):
        fired = _c_fire(mod, bound, stream, scratch if bound.scratch else None, pointers(env),
                        None if args is None else args[i])
        if not fired:  # no current context on this thread: Triton's launcher makes one and runs the rest
            _each(launches[i:], env, None if args is None else args[i:])
            return
        bound.launcher.direct_launches += 1


def _each(launches, env, args) -> None:
    if args is None:
        for bound, pointers in launches:
            bound(*pointers(env))
    else:
        for (bound, pointers), launch_args in zip(launches, args):
            bound.run_with(pointers(env), launch_args)


_USE_C = [True]


def use_c_launcher(on: bool) -> bool:
    """Let bound launches go through the C launcher (True, where it is built) or always through Triton's
    (False): the benchmarks compare both in one process. Returns the previous setting."""
    before, _USE_C[0] = _USE_C[0], bool(on)
    return before


def _c_launch(bound: BoundLaunch, stream, pointers: tuple, args: tuple | None) -> bool:
    """The bound launch through the C launcher; False (nothing launched) where it is switched off, a launch
    hook is set or no CUDA context is current on this thread (Triton's launcher then makes one current and
    launches)."""
    if not _c_on():
        return False
    scratch = _scratch(bound.scratch, bound.align, stream) if bound.scratch else None
    return _c_fire(c_launcher(), bound, stream, scratch, pointers, args)


def _c_on() -> bool:
    """Whether bound launches may go through the C launcher now: switched on, and no launch hook set (a
    hook, e.g. a profiler's, gets its metadata from Triton's launcher alone)."""
    runtime = knobs.runtime
    return _USE_C[0] and _hook(runtime.launch_enter_hook) is None and _hook(runtime.launch_exit_hook) is None


def _c_fire(mod, bound: BoundLaunch, stream, scratch, pointers: tuple, args: tuple | None) -> bool:
    """One packed launch: its bound scalars, or `args` after its pointers (launch_with). False where no CUDA
    context is current (nothing launched)."""
    if args is None:
        return mod.launch(bound.packed, stream, scratch, *pointers)
    return mod.launch_with(bound.packed, stream, scratch, pointers, args)


def _c_fire_seq(mod, stream, scratch, values: tuple, tail: tuple) -> int:
    """A Sequence's launches in one C call; how many launched (fewer where no CUDA context is current)."""
    return mod.launch_seq(stream, scratch, values, *tail)


def _run(compiled, grid, stream, values) -> None:
    """What the JIT does with a compiled kernel once it has its arguments in signature order, minus the
    work of launch hooks where none is set (_hook): then neither Triton's launch_metadata (built for the
    hooks alone) nor a hook call runs."""
    g0, g1, g2 = (*grid, 1, 1)[:3]
    runtime = knobs.runtime
    enter, leave = _hook(runtime.launch_enter_hook), _hook(runtime.launch_exit_hook)
    metadata = None if enter is None and leave is None else compiled.launch_metadata(grid, stream, *values)
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave, *values)


def _hook(hook):
    """A launch hook as the launcher passes it, None where it would call nothing. Triton 3.6 keeps each in a
    HookChain that is never None: the compiled launcher then called the empty chain twice a launch, and
    launch_metadata built its LazyDict for it (~4 us of the H200 host's time a launch, by cProfile in
    the hf_generate_host probe). An empty chain calls nothing, so None in its place is the same launch."""
    calls = getattr(hook, "calls", None)
    return None if calls is not None and not calls else hook


def runtime_key() -> tuple:
    """The JIT knobs a compiled kernel depends on beyond its arguments: part of every signature, and of
    any cache of bound launches."""
    return knobs.runtime.debug, getattr(knobs.compilation, "instrumentation_mode", None)


__all__ = ["BoundLaunch", "DirectLauncher", "MAX_SIGNATURES", "Sequence", "cdiv", "current_stream",
           "ensure_scratch_allocator", "run_bound", "runtime_key", "sequence", "use_c_launcher"]
