"""Host-speed machinery of the attention launchers: a call's launches (Launch), run through their
DirectLaunchers and remembered as a plan (Plan: each launch bound to its compiled kernel, its pointers
left open) that a later call of the same key replays with its own tensors; host-built TMA descriptors.
The dense calls' plans (PLANS) are keyed by plan_key, kvcache.py's KV-cache calls' by kvcache._kv_key."""

from __future__ import annotations

import operator
from typing import Callable, NamedTuple

import torch

from .._cplan import module as cplan_module, program as cplan_program, reason as cplan_reason
from .._runtime import PLAIN, keep, remember, require_triton
from ..contract import Variant

require_triton()  # before anything imports triton: its absence is then the error table's "triton is required"
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from .._launch import (BoundLaunch, DirectLauncher, Sequence, ensure_scratch_allocator, run_bound,  # noqa: E402
                       runtime_key, sequence)
from .launch_args import INTERPRETED  # noqa: E402


MAX_GRID_Z = 65535  # CUDA's limit on gridDim.y and gridDim.z


class Launch(NamedTuple):
    """One kernel launch of a call: its leading pointer arguments by name (looked up in the call's
    tensors), then every other argument."""

    launcher: DirectLauncher
    grid: tuple
    pointers: tuple[str, ...]
    args: tuple
    meta: dict


class Plan(NamedTuple):
    launches: tuple[tuple[BoundLaunch, Callable[[dict], tuple]], ...]  # each with its pointers' getter (env -> tuple)
    tma: bool  # some launch builds TMA descriptors on the device: Triton needs a scratch allocator
    descs: tuple = ()  # (name, block_rows, block_cols): tensors the launches read through host descriptors
    scratch: tuple = ()  # (name, shape, dtype): buffers the launches use within the call, allocated per call
    seq: Sequence | None = None  # the launches as one C call (_launch.sequence), where each is packed for it


PLANS: dict[tuple, Plan] = {}  # the dense calls' plans (launch.py's attention_fwd, launch_bwd.py's attention_bwd)
keep("attention plans", lambda: (PLANS,))


def layout_key(t: torch.Tensor | None):
    # everything a launch specializes on per tensor (Triton: dtype, alignment; ours: shape, strides)
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() % 16 == 0)


def plan_key(kind: str, inputs: tuple, variant: Variant, scale: float,
              overrides: tuple = (None, None)) -> tuple | None:
    """The key of a call's plan, or None where there is no plan: under the interpreter (no compiled
    kernels) and for batches that need more than one grid (MAX_GRID_Z). `overrides`: the call's
    explicit (config, group), so that a benchmark of given tiles replays a plan as users' calls do and
    times the kernels, not the host path that picks tiles. (kvcache.py keys its plans on classes of the
    caches' lengths instead: kvcache._kv_key.)"""
    if PLAIN or INTERPRETED or not inputs[0].is_cuda or inputs[0].shape[0] > MAX_GRID_Z:
        return None
    return (kind, variant, scale, inputs[0].device, torch.cuda.current_device(), *runtime_key(), *map(layout_key, inputs),
            *overrides)


def z_chunks(z: int, env: dict) -> list[tuple[int, dict]]:
    """CUDA caps a grid's z dimension at 65535: launch larger batches in slices along dim 0 (views,
    no copy). Returns [(z_count, tensors by name, sliced), ...]; a single chunk keeps the tensors."""
    if z <= MAX_GRID_Z:
        return [(z, env)]
    return [(min(z, z0 + MAX_GRID_Z) - z0,
             {name: t[z0:z0 + MAX_GRID_Z] if _per_batch(name, t) else t for name, t in env.items()})
            for z0 in range(0, z, MAX_GRID_Z)]


def _per_batch(name: str, t: torch.Tensor | None) -> bool:
    # per-head tensors (sinks (H,), ALiBi slopes (H,)) are the same for every slice of the batch
    return t is not None and not (name in ("sinks", "alibi") and t.dim() == 1)


def aligned(*outputs: torch.Tensor) -> bool:
    # fresh allocations: the caching allocator's blocks are 512-byte aligned, but a plan assumes nothing
    return all(t.data_ptr() % 16 == 0 for t in outputs)


def launch_chunks(chunks, key: tuple | None, tma: bool, descs: tuple = (), scratch: tuple = (), *, plans: dict,
                  compile_only: bool = False) -> None:
    """Run each chunk's launches ([(tensors by name, [Launch, ...]), ...]) through the launchers, and
    remember them in `plans` (the caller's store) as the plan of `key` when there was one chunk and every
    launch has a compiled kernel.
    descs: (name, block_rows, block_cols) of the tensors read through host descriptors (host_descriptor),
    which each chunk's tensors become here. scratch: (name, shape, dtype) of the call's buffers (in the
    chunks' tensors), which the plan allocates again on every replay (scratch_buffers).
    compile_only: launch nothing and keep no plan; the launchers compile the kernels ahead (_launch)."""
    if tma and not compile_only:
        ensure_scratch_allocator()
    if descs:
        chunks = [(_with_descriptors(env, descs), launches) for env, launches in chunks]
    for env, launches in chunks:
        if compile_only:
            for lc in launches:
                lc.launcher.compile_ahead(lc.grid, (*(env[name] for name in lc.pointers), *lc.args), lc.meta)
        else:
            run_launches(env, launches)
    if key is None or len(chunks) != 1 or compile_only:
        return
    plan = bind_plan(chunks[0], tma, descs, scratch)
    if plan is not None:
        remember(plans, key, plan)


def run_launches(env: dict, launches) -> None:
    """Each launch through its launcher, its pointers looked up by name in env; the kernels of the launches
    after the first compile ahead (on worker threads: _launch) while the first one's compiles, if they must."""
    calls = [(lc.launcher, lc.grid, (*(env[name] for name in lc.pointers), *lc.args), lc.meta) for lc in launches]
    for launcher, grid, args, meta in calls[1:]:
        launcher.compile_ahead(grid, args, meta)
    for launcher, grid, args, meta in calls:
        launcher(grid, *args, **meta)


def bind_plan(chunk, tma: bool, descs: tuple = (), scratch: tuple = ()) -> Plan | None:
    """The plan of one chunk's launches, just run: each bound to its compiled kernel with its pointers
    left open. None when some launch has no compiled kernel (the interpreter, a defaulted parameter)."""
    env, launches = chunk
    bound = []
    for lc in launches:
        b = lc.launcher.bind(lc.grid, tuple(env[name] for name in lc.pointers), lc.args, lc.meta)
        if b is None:
            return None
        bound.append((b, _pointer_getter(lc.pointers)))
    return Plan(tuple(bound), tma, descs, scratch, sequence([b for b, _ in bound], [lc.pointers for lc in launches]))


def _pointer_getter(names: tuple[str, ...]):
    """env -> the tuple of env[name] for names, in one C call (operator.itemgetter) where a generator
    costs ~1 us a launch of the GPU machine's host time."""
    if len(names) == 1:
        return lambda env: (env[names[0]],)
    return operator.itemgetter(*names)


def scratch_buffers(spec: tuple, device: torch.device) -> dict:
    """A call's scratch buffers by name, from their (name, shape, dtype)."""
    return {name: torch.empty(shape, dtype=dtype, device=device) for name, shape, dtype in spec}


def replayable_here(device: int, runtime: tuple) -> bool:
    """Whether a plan bound on `device` under the JIT knobs `runtime` (runtime_key) can replay now: the
    current device is the same and the knobs have not changed. The callers that keep a plan outside the
    launchers' keyed stores (FastForward, FastBackward, FastKV) ask before each replay."""
    # (torch.cuda.current_device() less its lazy init: a plan exists only where CUDA is initialized)
    return torch._C._cuda_getDevice() == device and runtime_key() == runtime


def replay(plan: Plan, env: dict) -> None:
    """Run a plan's launches on env's tensors, its scratch buffers allocated where env has none (a caller that
    checks their alignment first allocates them itself: scratch_buffers)."""
    if plan.tma:
        ensure_scratch_allocator()  # per thread: autograd's backward thread starts without one
    if plan.scratch and plan.scratch[0][0] not in env:
        env = {**env, **scratch_buffers(plan.scratch, env["q"].device)}  # (every attention call's env has q)
    if plan.descs:
        env = _with_descriptors(env, plan.descs)
    run_bound(plan.launches, env, seq=plan.seq)


def program_of(plan: Plan, env: dict, inputs: tuple[str, ...], allocs: dict, returned: tuple[str, ...],
               sources: dict | None = None, args: tuple | None = None):
    """The plan as one C++ call (_cplan.Program) for calls like this one (env: its tensors, the plan's layout);
    None while the C++ module is being built (a later replay asks again); False where there will be none: no
    C++ module, no Sequence, a name it cannot place, or a descriptor not at its tensor's address (the C++ call
    passes tensors' addresses, which replace the descriptors' own: _claunch.c put_pointer). inputs, allocs,
    returned, sources, args: as _cplan.program; the plan's scratch buffers are added to allocs."""
    if cplan_module() is None:
        return False if cplan_reason() is not None else None
    seq = plan.seq
    if seq is None:
        return False
    sources = dict(sources or {})
    if plan.descs:
        with_descs = _with_descriptors(env, plan.descs)
        for spec in plan.descs:
            name = spec[0]
            key = name if len(spec) == 3 else "gluon_" + name
            base = getattr(with_descs[key], "base", None)
            if not isinstance(base, torch.Tensor) or base.data_ptr() != env[name].data_ptr():
                return False
            sources[key] = name
    allocs = {**allocs, **{name: ("new", shape, dtype) for name, shape, dtype in plan.scratch}}
    return cplan_program(seq, inputs, allocs, returned, sources, args) or False


def replay_with(plan: Plan, env: dict, args: list[tuple]) -> bool:
    """A plan run with this call's arguments (kvcache._kv_key's plans), one tuple per launch, each
    argument of the Triton class the plan's was (the key's guarantee; the grids, fixed by the key, are the
    plan's). False, launching nothing, where the count of launches differs or the plan reads host
    descriptors (built from exact shapes): the caller then launches the call itself."""
    if plan.descs or len(args) != len(plan.launches):
        return False
    if plan.tma:
        ensure_scratch_allocator()
    run_bound(plan.launches, env, args)
    return True


def host_descriptor(t: torch.Tensor, block_rows: int, block_cols: int, gluon: bool = False) -> TensorDescriptor:
    """A TMA descriptor over a whole (Z, H, N, D) tensor (a (Z*H, N, D) one as (Z*H, 1, N, D)) in
    (1, 1, block_rows, block_cols) blocks; the kernels load slice (z, h)'s tile at row r as [z, h, r, 0]
    (_desc_load4). Built once per launch on the host, where each program would otherwise build its
    slice's descriptor in global memory (tl.make_tensor_descriptor): D128 N1024 forward in a minimal
    kernel, 400 -> 424 TFLOPS on the H200. The hardware needs every stride 16-byte aligned: a size-1
    dimension's stride never moves the address, so it is given a dense one. Needs tma_ok and
    host_descriptors_ok. gluon: Gluon's descriptor instead (hopper.descriptor: it carries its shared layout)."""
    if t.dim() == 3:
        (z, n, d), (sz, sn, _) = t.shape, t.stride()
        h, sh = 1, 0
    else:
        (z, h, n, d), (sz, sh, sn, _) = t.shape, t.stride()
    sn = sn if n > 1 else d
    sh = sh if h > 1 else n * sn
    sz = sz if z > 1 else h * sh
    if gluon:
        from .hopper import descriptor  # only where the Hopper kernel runs

        return descriptor(t, [z, h, n, d], [sz, sh, sn, 1], [1, 1, block_rows, block_cols])
    return TensorDescriptor(t, [z, h, n, d], [sz, sh, sn, 1], [1, 1, block_rows, block_cols])


def packed_view(t: torch.Tensor) -> torch.Tensor:
    """Packed sequences' (T, H, D) tensor as the (1, H, T, D) view the kernels index. Never copies."""
    return t.transpose(0, 1).unsqueeze(0)


def packed_host_descriptor(t: torch.Tensor, block_rows: int, block_cols: int, gluon: bool = False):
    """host_descriptor of packed sequences (T, H, D) as their packed_view (a plan's replay passes the caller's
    (T, H, D) tensor, its first launch the view)."""
    return host_descriptor(t if t.dim() == 4 else packed_view(t), block_rows, block_cols, gluon)


# Host descriptors cost host time, per launch: three TensorDescriptor objects and Triton's encoding of
# each (cuTensorMapEncodeTiled), ~18 us on the H200 host (bench/overhead.py: a D128 TMA launch 42 against
# 24 us). They save each program building its own (D128 N1024: ~4.5 us of an 84 us kernel). Calls with
# less work than this (Z*H*N_q*N_k*padded head_dim; 2^32 is a ~40 us kernel) keep the per-program ones:
# a short call is bound by host time, and short-sequence cells measured 30 -> 45 us with host descriptors.
HOST_DESC_MIN_WORK = 1 << 32


def host_descriptors_ok(*tensors: torch.Tensor) -> bool:
    """Whether host_descriptor can describe these tma_ok tensors: no stride 0 where a dimension has
    more than one element (an expanded, broadcast view: TMA strides must be positive). Such inputs read
    through the per-program descriptors instead."""
    return all(stride != 0 or size == 1 for t in tensors for size, stride in zip(t.shape, t.stride()))


def _with_descriptors(env: dict, descs: tuple) -> dict:
    """env with the descriptors of descs: (name, rows, cols) replaces tensor `name` by its descriptor;
    (name, rows, cols, True) adds Gluon's as gluon_<name> beside the tensor (the Hopper kernels read that);
    (name, make) adds make(tensor) as gluon_<name> (hopper.bwd_descriptors' flat row statistics)."""
    return {**env, **{("gluon_" + spec[0] if len(spec) != 3 else spec[0]):
                      spec[1](env[spec[0]]) if len(spec) == 2 else host_descriptor(env[spec[0]], *spec[1:])
                      for spec in descs}}
