"""The API's fast path into the launchers' plans: a dense call's plan (plans.PLANS), found once for a
call of a known layout and then replayed by the caller (ops/attention_fast.py) with nothing derived again."""

from __future__ import annotations

import weakref
from threading import get_ident

import torch

from .._cplan import programs_on
from .._launch import c_sequence_ok, current_stream, runtime_key
from .._runtime import PLAIN, remember
from ..contract import empty_out, variant
from .launch import decode_route
from .launch_bwd import one_pass_of
from .views import heads_of
from .plans import PLANS, Plan, aligned, plan_key, program_of, replay, replayable_here, scratch_buffers


# Row statistics that only the call's own launches read (an lse no caller reads: a call without autograd
# and without return_lse; the backward's delta and its second lse) go to buffers the plan's holder keeps
# per stream and thread, where they are small: a torch.empty costs ~4-8 us of the H200 host's time
# (bench/results/host_budget_h200.txt), more than a short call's kernels leave it. The launches of one
# stream run in order, so a call writes them after the previous call's kernels read them; a CUDA graph being
# captured gets fresh ones. Above this many rows a call's GPU time hides the allocation and nothing is kept.
KEEP_ROWS_MAX = 1 << 18
MAX_KEPT_ROWS = 16  # kept entries per holder (streams x threads, each one set of slots): more start over


def _rows(store: dict | None, device: int, q: torch.Tensor, slots: tuple[str, ...]) -> tuple:
    """fp32 buffers of q's rows (q.shape[:-1]), one per slot: those kept in `store` for these slots, the
    current stream and thread (one lookup for all of them), or fresh ones where nothing is kept (store None:
    a large call, or a caller that reads them; a capture). (q.new_empty: ~2 us less host time than
    torch.empty's device=.)"""
    if store is None or torch._C._cuda_isCurrentStreamCapturing():
        return tuple([q.new_empty(q.shape[:-1], dtype=torch.float32) for _ in slots])
    key = (current_stream(device), get_ident(), slots)
    bufs = store.get(key)
    if bufs is None:
        bufs = remember(store, key, tuple([q.new_empty(q.shape[:-1], dtype=torch.float32) for _ in slots]),
                        MAX_KEPT_ROWS)
    return bufs


_LSE = ("lse",)
_BACKWARD_ROWS = ("delta", "lse2")


def _keeps(q: torch.Tensor) -> dict | None:
    """A store of kept row buffers for calls of q's layout, or None where its rows are too many to keep."""
    return {} if q.numel() // max(q.shape[-1], 1) <= KEEP_ROWS_MAX and not PLAIN else None


# What a fast replay's C++ call allocates (_cplan.program: "like" an input, its "rows" in fp32) and the env
# entries that are None
_FORWARD_ALLOCS = {"out": ("like", "q"), "lse": ("rows", "q"), "seq_lens": None, "cu_k": None, "alibi": None,
                   "sinks": None}
_BACKWARD_ALLOCS_NO_ROWS = {"dq": ("like", "q"), "dk": ("like", "k"), "dv": ("like", "v"), "dlse": None,
                            "seq_lens": None, "cu_k": None, "alibi": None, "dq_acc": None}
_BACKWARD_ALLOCS = {**_BACKWARD_ALLOCS_NO_ROWS, "delta": ("rows", "q"), "lse2": ("rows", "q")}


class FastForward:
    """A dense forward's plan, held by the caller that keys it on its own arguments (ops/attention_fast.py:
    the API's fast path): calling it with tensors of the layout the plan was made for allocates out and lse
    and replays the plan, and nothing else (no tiles, variant or plan key are derived again). Returns
    (out, lse), or None where the plan cannot run now (another current device, changed JIT knobs, an
    unaligned output), which the caller answers by the ordinary path. need_lse=False: the caller does not
    read lse, which may then be a kept buffer (KEEP_ROWS_MAX)."""

    __slots__ = ("plan", "dv", "device", "runtime", "backwards", "kept", "program", "node", "__weakref__")

    def __init__(self, plan: Plan, dv: int, device: int, runtime: tuple, kept: dict | None = None):
        self.plan, self.dv, self.device, self.runtime = plan, dv, device, runtime
        self.backwards: dict = {}  # the caller's: its FastBackwards by dout's layout
        self.kept = kept  # (stream, thread, slot) -> buffer (_rows), or None: nothing kept (_keeps)
        self.program = None  # the plan as one C++ call (plans.program_of), False where it cannot be one
        self.node = None  # (the C++ module, the id of its Cache of backward Programs): node_cache

    def node_cache(self, mod) -> int:
        """The id of this plan's Cache in the C++ module `mod`: the Programs of its FastBackwards (`offer`), which
        the fast path's autograd node runs (_cplan.cpp `Attention`). Emptied when this plan goes."""
        node = self.node
        if node is None:
            node = self.node = (mod, mod.cache_new(self.device))
            weakref.finalize(self, mod.cache_clear, node[1]).atexit = False
        return node[1]

    def node_programs(self) -> bool:
        """Whether the autograd node of a call of this plan may run kept Programs: where this plan's own could
        (Programs in use, the C launcher on, no launch hook set)."""
        return programs_on() and c_sequence_ok(self.plan.seq)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, need_lse: bool = True):
        if not replayable_here(self.device, self.runtime):
            return None
        program = self.program
        if program and c_sequence_ok(self.plan.seq):
            result = program(current_stream(self.device), (q, k, v))
            if result is not None:
                return result
        out = empty_out(q, self.dv)
        (lse,) = _rows(None if need_lse else self.kept, self.device, q, _LSE)
        if not aligned(out, lse):
            return None
        env = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "seq_lens": None, "cu_k": None, "alibi": None,
               "sinks": None}
        replay(self.plan, env)
        if program is None:  # (out in empty_out's other layouts, where D_v != D: no C++ call)
            self.program = (program_of(self.plan, env, ("q", "k", "v"), _FORWARD_ALLOCS, ("out", "lse"))
                            if self.dv == q.shape[-1] else False)
        return out, lse


def _dense_plan(kind: str, inputs: tuple, q, k, causal: bool, scale: float, window: tuple[int, int],
                softcap: float, overrides: tuple) -> Plan | None:
    """The plan attention_fwd / attention_bwd keeps for these inputs (plan_key with this kind, inputs and
    overrides), where it runs on the current device; else None."""
    if q.get_device() != torch.cuda.current_device():
        return None
    var = variant(causal, window, softcap, q.shape[-2], k.shape[-2], heads_of(q), heads_of(k))
    key = plan_key(kind, inputs, var, scale, overrides)
    return PLANS.get(key) if key is not None else None


def fast_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                 window: tuple[int, int], softcap: float) -> FastForward | None:
    """The plan attention_fwd made for this call (just run, without seq_lens, ALiBi or sinks) as a
    FastForward; None where it made none (the decode route, the interpreter, a batch of several grids,
    an empty call) or runs on another device than the current one."""
    if decode_route(q, k, None, None, None, None):
        return None
    plan = _dense_plan("fwd", (q, k, v, None, None, None, None), q, k, causal, scale, window, softcap, (None, None))
    return None if plan is None else FastForward(plan, v.shape[-1], q.get_device(), runtime_key(), _keeps(q))


class FastBackward:
    """A dense backward's plan (without dlse), held by the caller beside the forward's FastForward:
    calling it with tensors of the layout the plan was made for allocates dq, dk, dv and the row
    statistics (kept buffers where small: KEEP_ROWS_MAX) and replays the plan. Returns (dq, dk, dv), or None
    where the plan cannot run now."""

    __slots__ = ("plan", "device", "runtime", "kept", "rows", "program")

    def __init__(self, plan: Plan, device: int, runtime: tuple, kept: dict | None = None):
        self.plan, self.device, self.runtime = plan, device, runtime
        self.kept = kept
        # delta and lse2 from here, unless the plan has its own (the Hopper backward's, padded: its scratch)
        self.rows = all(name != "delta" for name, _, _ in plan.scratch)
        self.program = None  # as FastForward's

    def __call__(self, dout, q, k, v, out, lse):
        if not replayable_here(self.device, self.runtime):
            return None
        program = self.program
        if program and c_sequence_ok(self.plan.seq):
            result = program(current_stream(self.device), (dout, q, k, v, out, lse))
            if result is not None:
                return result
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        env = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse, "dlse": None, "dq": dq, "dk": dk,
               "dv": dv, "seq_lens": None, "cu_k": None, "alibi": None, "dq_acc": None}
        if self.rows:
            env["delta"], env["lse2"] = _rows(self.kept, self.device, q, _BACKWARD_ROWS)
        if self.plan.scratch:
            env.update(scratch_buffers(self.plan.scratch, q.device))
        if not aligned(dq, dk, dv, env["delta"], env["lse2"], *(env[name] for name, _, _ in self.plan.scratch)):
            return None
        replay(self.plan, env)
        if program is None:
            self.program = program_of(self.plan, env, ("dout", "q", "k", "v", "out", "lse"),
                                      _BACKWARD_ALLOCS if self.rows else _BACKWARD_ALLOCS_NO_ROWS, ("dq", "dk", "dv"))
        return dq, dk, dv

    def offer(self, fast: FastForward, dout, deterministic: bool) -> None:
        """Give this plan's Program, where it has one that may run now, to the forward's node Cache (node_cache)
        for backwards of dout's layout and mode."""
        program = self.program
        if program and fast.node is not None and c_sequence_ok(self.plan.seq):
            fast.node[0].cache_add(fast.node[1], dout, deterministic, program.capsule)


def fast_backward(dout, q, k, v, out, lse, causal: bool, scale: float, window: tuple[int, int],
                  softcap: float, deterministic: bool) -> FastBackward | None:
    """The plan attention_bwd made for this call (just run, without dlse, seq_lens or ALiBi) as a
    FastBackward; None where it made none."""
    atomic = one_pass_of(q, v, q.shape[-2], k.shape[-2], deterministic, None)
    plan = _dense_plan("bwd", (q, k, v, out, dout, lse, None, None, None, None), q, k, causal, scale, window,
                       softcap, (None, None, None, atomic, not deterministic))
    return None if plan is None else FastBackward(plan, q.get_device(), runtime_key(), _keeps(q))
