"""The KV-cache launcher (attention_kvcache): the append, the split count, the decode (and combine) launches."""

from __future__ import annotations

from threading import get_ident
from typing import NamedTuple

import torch

from .._runtime import PLAIN, device_limits, keep, remember, require_triton
from ..attention_configs import head_dim_pad
from ..contract import DECODE_MAX_ROWS, LOG2E, Variant, band, empty_out, kvcache_capacity, variant

require_triton()  # before anything imports triton: its absence is then the error table's "triton is required"
from .._launch import DirectLauncher, c_sequence_ok, current_stream, int_class, cdiv, runtime_key  # noqa: E402
from .decode import _attn_decode_combine_kernel, _attn_decode_kernel, _cache_append_kernel  # noqa: E402
from ..value_checks import check_kvcache  # noqa: E402
from .launch_args import INTERPRETED, alibi_stride, dot_precision, upcast, v_pad  # noqa: E402
from .plans import (MAX_GRID_Z, aligned, bind_plan, Launch, layout_key, program_of, replay_with,  # noqa: E402
                    replayable_here, run_launches)

_APPEND = DirectLauncher(_cache_append_kernel)
_DECODE = DirectLauncher(_attn_decode_kernel)
_COMBINE = DirectLauncher(_attn_decode_combine_kernel)
LAUNCHERS = (_APPEND, _DECODE, _COMBINE)

DECODE_BLOCK_N = 64  # keys per step: a paged cache of 16-row pages reads four pages a step
DECODE_WARPS = 4
MAX_SPLITS = 64
MIN_KEYS_PER_SPLIT = 128  # below this a split's fixed cost (q load, partial store, merge) dominates
# An eager call's splits (up to MERGE_MAX_SPLITS a row tile) are merged by the tile's last program to finish
# (MERGE): one launch less, 4-9 us of host time a decode step on the H200's hosts, for 0.3-1.5 us more GPU
# time than the combine launch (bench/results/decode_merge_ab_h200.jsonl). Calls through the op (torch.compile,
# CUDA graphs: GPU time is all they pay) and paged calls (64 splits at B1, where a merge of all 64 took the
# kernel from 18 to 31 us) take the combine kernel; both merge with _merge_rows, so the bits are the same.
MERGE_MAX_SPLITS = 16
MERGE_ELEMENTS = 8192  # fp32 partials a merge step holds: 64 registers a thread of the decode's 4 warps


def merge_rows(splits: int, dv_pad: int, block_m: int) -> int:
    """Rows a merge step takes: as many as MERGE_ELEMENTS holds with all their splits' partials."""
    return max(1, min(block_m, MERGE_ELEMENTS // (_pow2(splits) * dv_pad)))


def _merges(splits: int, keep: bool, paged: bool) -> bool:
    """Whether the decode launch merges its splits (MERGE): an eager call's (keep) on a contiguous cache with
    at most MERGE_MAX_SPLITS; under the interpreter every call's up to that many (no host cost to save, but
    CI runs both merges there)."""
    return 1 < splits <= MERGE_MAX_SPLITS and (INTERPRETED or keep and not paged)


def _pow2(n: int) -> int:
    return max(2, 1 << (n - 1).bit_length())
# plans of earlier calls (plans.Plan), keyed (_kv_key) on the layouts, with the caches' strides and lengths
# by their classes, the variant as the kernels take it, scale, num_splits and the split count
_KV_PLANS: dict[tuple, object] = {}


def decode_rows(n_q: int, kv_group: int) -> int:
    """Rows of a decode tile: the packed (query, head) rows of a kv head, 16 (tl.dot's minimum) to
    DECODE_MAX_ROWS."""
    return min(DECODE_MAX_ROWS, max(16, 1 << (n_q * kv_group - 1).bit_length()))


# Programs of a decode launch and where they sit: the time falls in steps with whole waves of programs (B8
# L8k, 8 kv heads, D128: 80.0 us at 128 or 256 programs, 83.8 at 320, a second partial wave; H200,
# bench/results/decode_probe_h200.txt), and one program an SM was as fast as two or faster. An unsplit grid of more than
# two programs an SM reads best with 2 stages, three programs an SM (B64 L8k 550 -> 485 us,
# bench/results/decode_tiles_h200.txt). A paged cache is the exception: each step's keys wait for their
# block-table entry, and the more programs an SM, the more of that latency is hidden (B1 L64k, page 256: 123.7
# us at one program an SM, 71.2 at four; bench/results/decode_paged_probe_h200.txt). Paged launches take four
# programs an SM.


def num_splits_for(batch: int, h_kv: int, row_tiles: int, capacity: int, device: torch.device,
                   paged: bool = False) -> int:
    """How many key ranges each (batch, kv head, row tile) is cut into: one whole wave of programs, one an
    SM (four an SM for a paged cache; see above), no more than one split per MIN_KEYS_PER_SPLIT
    keys of the cache's capacity (the lengths themselves are on the device: reading them would sync), at
    most MAX_SPLITS. One split when the grid already fills the GPU (and under the interpreter, with no SMs
    to fill, unless asked)."""
    return splits_within(split_ceiling(batch, h_kv, row_tiles, device, paged), capacity)


def split_ceiling(batch: int, h_kv: int, row_tiles: int, device: torch.device, paged: bool = False) -> int:
    """num_splits_for's bound but the cache's capacity: what a cache of another length keeps (FastKV.grown)."""
    sms = _sms(device)
    programs = batch * h_kv * row_tiles
    if not sms or programs >= sms:
        return 1
    return min(MAX_SPLITS, 4 * sms // programs if paged else sms // programs)


def splits_within(ceiling: int, capacity: int) -> int:
    """The split count under split_ceiling's bound for a cache of `capacity` keys (num_splits_for)."""
    return max(1, min(ceiling, capacity // MIN_KEYS_PER_SPLIT))


def decode_stages(programs: int, splits: int, device: torch.device) -> int:
    """The decode kernel's pipeline stages for `programs` (batch x kv heads x row tiles) programs, each
    split `splits` ways: 2 (three programs an SM) for unsplit grids of more than two programs an SM, else 3
    (see above; split paged grids measured with 3); 1 under the interpreter."""
    if INTERPRETED:
        return 1
    sms = _sms(device)
    return 2 if sms and splits == 1 and programs > 2 * sms else 3


def _sms(device: torch.device) -> int:
    return device_limits(device).sms or 0  # 0: no SMs to fill (the interpreter); cached, and device.type costs ~1 us


def attention_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | None,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    block_table: torch.Tensor | None,
    causal: bool,
    scale: float,
    *,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    num_splits: int = 0,
    cache_leftpad: torch.Tensor | None = None,
    need_lse: bool = True,
    keep_scratch: bool = False,
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Write k_new / v_new (B, H_kv, N_new, D) into the cache at cache_seqlens[b] + j (in place), then
    attend q (B, H, N_q, D) to each batch's first cache_seqlens[b] + N_new keys. The cache is (B, H_kv,
    N_cache, D) with any strides, or paged (num_pages, H_kv, page_size, D) through block_table (B,
    max_pages) int32. cache_seqlens int32 (B,) contiguous, or None: every batch attends to all N_cache keys
    (no new keys then; launch.attention_fwd's route for a few query rows). cache_leftpad int32 (B,)
    contiguous, or None: batch b's keys start at slot cache_leftpad[b] (a left-padded cache; the slots
    before it are never read). num_splits: 0 picks (num_splits_for).
    Returns out (B, H, N_q, D_v) in q's layout and lse (B, H, N_q) fp32, or None without need_lse.
    keep_scratch: the caller is the API's eager shortcut (ops/eager.py dispatcher_free), whose scratch
    (split-KV's partials, an lse not needed) may then live in buffers kept between calls (_kept), allocations
    fewer; a call through the op never keeps them: torch.compile's CUDA-graph trees run the op in a warmup
    whose memory pool must hold nothing beyond the call (mode="reduce-overhead", transformers' static cache).
    A call with the layouts of an earlier one, the caches' strides and lengths of the same classes (_kv_key),
    replays that call's bound launches with its own arguments (plans.replay_with: ~the launches' own host
    cost).
    check: assert cache_seqlens' and the pages' values on the device (value_checks' KV-cache rules) inside
    the decode launch, where the API's eager call would queue the check kernel (validate=True): one launch
    less. The check kernel runs where no decode launch does."""
    check = check and cache_seqlens is not None
    keep = _keeps(q) if keep_scratch else None
    out, lse = _outputs(q, v_cache.shape[-1], need_lse, keep)
    call = _call_layout(q, k_cache, v_cache, k_new, v_new, block_table, causal, scale, window, softcap, alibi_slopes,
                        num_splits, _strides_of(out), keep)
    env = _env(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, alibi_slopes, sinks, cache_leftpad,
               out, lse)
    if call.var is None:  # nothing to attend: the append alone
        if check:
            check_kvcache(cache_seqlens, call.n_new, call.capacity, block_table, call.num_pages, cache_leftpad)
        run_launches(env, _launches(q, k_cache, v_cache, call, env, check))
        return out, lse if need_lse else None
    env.update(_partials(q, out, lse, call, keep))
    others = (cache_seqlens, k_new, v_new, block_table, alibi_slopes, sinks, cache_leftpad)
    key = _kv_key(q, k_cache, v_cache, call, others, scale, num_splits, check)
    if key is not None and not aligned(out, lse, env["dst"], env["dst_lse"]):  # the key assumes it
        key = None
    hit = _KV_PLANS.get(key) if key is not None else None
    if hit is not None and replay_with(hit, env, call.args):
        return out, lse if need_lse else None
    launches = _launches(q, k_cache, v_cache, call, env, check)
    run_launches(env, launches)
    if key is not None:
        plan = bind_plan((env, launches), False)
        if plan is not None:
            remember(_KV_PLANS, key, plan)
    return out, lse if need_lse else None


def _outputs(q: torch.Tensor, dv: int, need_lse: bool, keep: tuple | None) -> tuple[torch.Tensor, torch.Tensor]:
    """out in q's layout, and lse (B, H, N_q) fp32 contiguous: fresh where a caller sees it (need_lse) or
    nothing may be kept (keep None), else a kept buffer (_kept)."""
    out = empty_out(q, dv)
    lse = (torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device) if need_lse or keep is None
           else _kept_lse(q, keep))
    return out, lse


def _kept_lse(q: torch.Tensor, keep: tuple) -> torch.Tensor:
    """The kept lse of an eager call that does not return it (_outputs)."""
    return _kept(q, keep, "lse", q.numel() // q.shape[-1])


def _env(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, alibi_slopes, sinks, cache_leftpad, out,
         lse) -> dict:
    """A call's tensors by the names its launches' pointers take (_launches); the partials come later."""
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": cache_seqlens, "k_new": k_new,
            "v_new": v_new, "block_table": block_table, "alibi": alibi_slopes, "sinks": sinks,
            "leftpad": cache_leftpad, "out": out, "lse": lse}


MAX_KINS = 16  # FastKVs a decode caller keeps by kin (FastKV.join): a few split counts and length classes
_NO_INDEXES = (False, False, False)  # a FastKV program's `indexes` without cache_seqlens, block_table, cache_leftpad


class FastKV:
    """A KV-cache call's plan with its launches' arguments, held by a caller that keys it on the call's
    exact layouts (ops/attention_fast.py, the API's fast path for a decode step without new keys): calling
    it allocates out (and lse, or takes kept buffers as the API's eager calls do) and replays the plan.
    Returns (out, lse or None), or None where the plan cannot run now (another current device, changed JIT
    knobs, an unaligned buffer)."""

    __slots__ = ("plan", "call", "dv", "need_lse", "device", "runtime", "kin", "program", "values", "kept")

    def __init__(self, plan, call: CallLayout, dv, need_lse, device, runtime, kin: tuple | None = None):
        self.plan, self.call, self.dv = plan, call, dv
        # what a cache of another length must share with this call to run its plan (grown)
        self.kin = (call.splits, call.merge, _classes(call.grows)) if kin is None else kin
        self.need_lse, self.device, self.runtime = need_lse, device, runtime
        self.program = None  # (the plan as one C++ call, its index tensors given) where it can be; False where not
        # this call's launch scalars where `call` is another's of the same kin (grown), which the plan was made for
        self.values = None
        # (keep, _kept_inputs) of the latest C++ call: a store lookup a buffer a call otherwise. A buffer the store
        # has since replaced by a longer one (another call's) stays this call's: its launches run in stream order
        self.kept = None

    def grown(self, q, k_cache, v_cache, causal: bool, window: tuple[int, int], family: dict) -> FastKV | None:
        """This decode-route call (no index tensors, num_splits 0) on caches of another length and strides, as a
        FastKV that runs the C++ call of this one or of one in `family` with its own launch scalars, where both
        are one plan: a DynamicCache is one token longer with new strides every decode step, and its launches are
        the same but for those ints. The caller (ops/attention_fast.py, _Decode) holds every other part of
        _kv_key fixed (q's layout, the caches' shapes but their length, dtypes, devices, the 16-byte alignments,
        the scalars, and with them the variant's flags); what depends on the length or on the stream's capture
        is the FastKV's `kin` (the split count, the merge, the growing ints' classes), and family holds the
        caller's FastKVs by kin (join): a length that crosses a multiple of 16 changes the classes, and back.
        The arguments are the source's with the growing ints put in (_grown_decode_args), not computed afresh
        (_call_layout). Both together took B1 decode steps of 4 layers from 1.05x SDPA's host time to 0.92x
        (medians of five processes a tree, bench/results/decode_grow_cplan_h200.txt).
        None where no FastKV of the kin has a C++ call: the caller then asks fast_kvcache (~25 us of the H200
        host's time a step: its key alone ~11 us, bench/results/host_budget_h200.txt)."""
        capacity = k_cache.shape[2]
        base = self.call
        splits = splits_within(base.ceiling, capacity)
        grows = (*k_cache.stride(), *v_cache.stride(), capacity, *band(causal, window, q.shape[2], capacity)[2:])
        kin = (splits, _merges(splits, _keeps(q) is not None, False), tuple(map(int_class, grows)))
        source = self if kin == self.kin else family.get(kin)
        if source is None or not source.program or source.plan.descs:
            return None
        args = source.call.args
        fast = FastKV(source.plan, source.call, source.dv, source.need_lse, source.device, source.runtime, kin)
        fast.program, fast.kept = source.program, source.kept  # (the same buffers' sizes)
        fast.values = (_grown_decode_args(args[0], grows), *args[1:])
        return fast

    def join(self, family: dict) -> None:
        """Put this FastKV in family (a caller's FastKVs by kin, which grown takes from) under its kin."""
        remember(family, self.kin, self, MAX_KINS)

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad):
        if not replayable_here(self.device, self.runtime):
            return None
        keep = _keeps(q)
        program = self.program
        if program and keep is not None and c_sequence_ok(self.plan.seq):
            run, indexes = program
            kept = self.kept
            if kept is None or kept[0] != keep:  # (another stream or thread than the call before's)
                kept = self.kept = (keep, _kept_inputs(q, self.call, keep, self.need_lse))
            if indexes == _NO_INDEXES:  # (the decode route's calls)
                tensors = (q, k_cache, v_cache, *kept[1])
            else:
                tensors = (q, k_cache, v_cache,
                           *[t for t, given in zip((cache_seqlens, block_table, cache_leftpad), indexes) if given],
                           *kept[1])
            result = run(keep[1], tensors, self.values)
            if result is not None:
                return result if self.need_lse else (result[0], None)
        out, lse = _outputs(q, self.dv, self.need_lse, keep)
        env = _env(q, k_cache, v_cache, cache_seqlens, None, None, block_table, None, None, cache_leftpad, out, lse)
        env.update(_partials(q, out, lse, self.call, keep))
        args = self.call.args if self.values is None else self.values
        if not aligned(out, lse, env["dst"], env["dst_lse"]) or not replay_with(self.plan, env, args):
            return None
        if program is None and keep is not None:
            self.program = self._program(q, env)
        return out, lse if self.need_lse else None

    def _program(self, q, env: dict):
        """(Program, which of cache_seqlens, block_table and cache_leftpad it takes: those given, the decode
        route's call gives none) after a replay of env from Python, where the plan can be one C++ call; None or
        False as plans.program_of answers."""
        if self.dv != q.shape[-1]:
            return False  # (out = empty_out's other layouts)
        optional = ("cache_seqlens", "block_table", "leftpad")
        indexes = tuple(env[name] is not None for name in optional)
        inputs = ("q", "k_cache", "v_cache", *[name for name, given in zip(optional, indexes) if given],
                  *_kept_names(self.call, self.need_lse))
        allocs = {"out": ("like", "q"), "lse": ("rows", "q") if self.need_lse else None, "k_new": None,
                  "v_new": None, "alibi": None, "sinks": None, **{name: None for name in optional}}
        if not self.need_lse:
            del allocs["lse"]  # (a kept input)
        sources = {"dst": "out", "dst_lse": "lse", "counts": "lse"} if self.call.splits == 1 else (
            {} if self.call.merge else {"counts": "lse"})
        program = program_of(self.plan, env, inputs, allocs, ("out", "lse") if self.need_lse else ("out",),
                             sources=sources, args=self.call.args)
        return (program, indexes) if program else program


def fast_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad, causal: bool, scale: float,
                 window: tuple[int, int], softcap: float, num_splits: int, need_lse: bool,
                 check: bool = False) -> FastKV | None:
    """The plan attention_kvcache made for this call (just run, from the API's eager path: no new keys,
    ALiBi or sinks; check as it was given) as a FastKV; None where it made none."""
    if q.get_device() != torch.cuda.current_device():
        return None
    out = empty_out(q, v_cache.shape[-1])  # its layout, for the arguments (the call's own was the same)
    call = _call_layout(q, k_cache, v_cache, None, None, block_table, causal, scale, window, softcap, None,
                        num_splits, _strides_of(out), _keeps(q))
    if call.var is None:
        return None
    others = (cache_seqlens, None, None, block_table, None, None, cache_leftpad)
    key = _kv_key(q, k_cache, v_cache, call, others, scale, num_splits, check and cache_seqlens is not None)
    plan = _KV_PLANS.get(key) if key is not None else None
    if plan is None:
        return None
    return FastKV(plan, call, v_cache.shape[-1], need_lse, q.get_device(), runtime_key())


class CallLayout(NamedTuple):
    """What a KV-cache call's launches take beyond their pointers, from its layout and arguments alone:
    each launch's arguments (append with new keys, decode, combine where split and not merged), the variant
    (None where no query row attends: the append alone), the decode tile rows, row tiles, the split count,
    whether the decode launch merges the splits, and the cache's geometry."""

    args: tuple
    var: Variant | None
    block_m: int
    row_tiles: int
    splits: int
    tiles: int  # programs a split: B x H_kv x row tiles
    merge: bool
    paged: bool
    page_size: int
    n_new: int
    capacity: int
    num_pages: int
    grows: tuple  # the ints of the args that grow with a contiguous cache (_kv_key counts their classes)
    out_strides: tuple | None = None  # out's strides (None: out has no element)
    ceiling: int = 1  # the split count's bound but the capacity (split_ceiling) where the call picks it (num_splits 0)


def _call_layout(q, k_cache, v_cache, k_new, v_new, block_table, causal, scale, window, softcap, alibi_slopes,
                 num_splits, out_strides: tuple | None, keep: tuple | None) -> CallLayout:
    """out_strides: out's strides (empty_out's, a function of q's layout), None where out has no element."""
    b, h, n_q, d = q.shape
    k_shape = k_cache.shape
    h_kv, dv = k_shape[1], v_cache.shape[-1]
    lse_strides = (h * n_q, n_q, 1)
    paged = block_table is not None
    if paged:
        page_size, num_pages, bt_stride = k_shape[2], k_shape[0], block_table.stride(0)
    else:
        page_size, num_pages, bt_stride = 1, 1, 0
    capacity = kvcache_capacity(k_cache, block_table)
    n_new = 0 if k_new is None else k_new.shape[2]
    k_strides, v_strides = k_cache.stride(), v_cache.stride()
    args = []  # each launch's arguments after its pointers: append (new keys), decode, combine (many splits)
    if n_new and b:
        args.append((*k_new.stride(), *v_new.stride(), *k_strides, *v_strides, bt_stride, n_new, capacity, num_pages))
    if out_strides is None:
        return CallLayout(tuple(args), None, 0, 0, 1, 0, False, paged, page_size, n_new, capacity, num_pages, ())
    var = variant(causal, window, softcap, n_q, capacity, h, h_kv)
    block_m = decode_rows(n_q, var.kv_group)
    row_tiles = cdiv(n_q * var.kv_group, block_m)
    ceiling = 1 if num_splits else split_ceiling(b, h_kv, row_tiles, q.device, paged)
    splits = num_splits or splits_within(ceiling, capacity)
    if splits > 1:  # the partials are contiguous (B, H, N_q, splits, D_v) and (B, H, N_q, splits)
        o_strides = (h * n_q * splits * dv, n_q * splits * dv, splits * dv, dv, 1)
        l_strides = (h * n_q * splits, n_q * splits, splits, 1)
    else:
        o_strides = (*out_strides[:3], 0, out_strides[3])
        l_strides = (*lse_strides, 0)
    args.append((*q.stride(), *k_strides, *v_strides, *o_strides, *l_strides, *out_strides, *lse_strides, bt_stride,
                 alibi_stride(alibi_slopes), h_kv, n_q, n_new, capacity, num_pages, splits, scale * LOG2E, var.kv_group,
                 var.left, var.right, var.cap2))
    merge = _merges(splits, keep is not None, paged)
    if splits > 1 and not merge:
        args.append((*out_strides, *lse_strides, h, n_q, splits, b * h * n_q))
    return CallLayout(tuple(args), var, block_m, row_tiles, splits, b * h_kv * row_tiles, merge, paged, page_size,
                      n_new, capacity, num_pages, (*k_strides, *v_strides, capacity, var.left, var.right), out_strides,
                      ceiling)


def _grown_decode_args(args: tuple, grows: tuple) -> tuple:
    """The decode launch's arguments `args` (_call_layout's, of a call on a 4-D cache) with the growing ints
    `grows` (CallLayout.grows: the caches' eight strides, the capacity, the band's sides) put in their places:
    the strides after q's four, the capacity eighth from the end, the sides third and second from the end.
    tests/test_kvcache_host.py checks it against _call_layout for every variant."""
    return (*args[:4], *grows[:8], *args[12:-8], grows[8], *args[-7:-3], grows[9], grows[10], args[-1])


def _strides_of(out: torch.Tensor) -> tuple | None:
    return out.stride() if out.numel() else None


def _kv_key(q, k_cache, v_cache, call: CallLayout, others: tuple, scale: float, num_splits: int,
            check: bool) -> tuple | None:
    """The key of a call's plan (None where there is none: the interpreter, a batch past MAX_GRID_Z): every
    exact layout the launches depend on, except that the caches' strides and lengths (`call.grows`: the
    strides, the capacity, and the band's sides, whose unbounded value N_q + N_k grows with the cache) count
    by their class as Triton specializes ints (int_class), so that a contiguous cache one token longer
    (transformers' DynamicCache: new length, new strides every decode step) replays the same plan with its
    own arguments (replay_with); the launches' grids and options follow from the exact parts."""
    if PLAIN or INTERPRETED or q.shape[0] > MAX_GRID_Z:
        return None
    k_shape, var = k_cache.shape, call.var
    return ("kvcache", q.device, torch.cuda.current_device(), *runtime_key(), q.dtype, q.shape, q.stride(),
            k_cache.dtype, v_cache.dtype, k_shape[0], k_shape[1], k_shape[3], v_cache.shape[3], call.page_size,
            (q.data_ptr() % 16, k_cache.data_ptr() % 16, v_cache.data_ptr() % 16), *map(layout_key, others),
            var.causal, var.window, var.cap2, var.kv_group, scale, num_splits, call.splits, call.merge, check,
            _classes(call.grows))


_CLASSES: dict[tuple, tuple] = {}  # exact ints -> their int_class tuple: a fixed-shape loop asks for the same ones


def _classes(ints: tuple[int, ...]) -> tuple:
    """The int_class of each of ints, remembered for the exact tuple: one dict lookup for a call of the same
    shapes as an earlier one, where eleven int_class calls cost ~4 us of the H200 host's time."""
    hit = _CLASSES.get(ints)
    if hit is None:
        hit = remember(_CLASSES, ints, tuple(map(int_class, ints)))
    return hit


def _launches(q, k_cache, v_cache, call: CallLayout, env: dict, check: bool) -> list[Launch]:
    """The call's launches (append, decode, combine; those `call.args` has arguments for), with their grids
    and options: what a call that replays no plan runs, and binds. env: the call's tensors by name. check:
    the decode kernel asserts the lengths and pages (attention_kvcache), compiled with Triton's debug on and
    its integer-overflow checks off (they would cost every address computation)."""
    b, h, n_q, d = q.shape
    h_kv, dv = k_cache.shape[1], v_cache.shape[-1]
    d_pad, dv_pad = head_dim_pad(d), v_pad(d, dv)
    n_new, paged, page_size, var, splits = call.n_new, call.paged, call.page_size, call.var, call.splits
    block_m, row_tiles, args = call.block_m, call.row_tiles, call.args
    common = dict(HEAD_DIM=d, HEAD_DIM_PAD=d_pad, HEAD_DIM_V=dv, HEAD_DIM_V_PAD=dv_pad, PAGED=paged,
                  PAGE_SIZE=page_size)
    launches = []
    args = list(args)
    if n_new and b:
        block = 16
        launches.append(Launch(
            _APPEND, (b, h_kv, cdiv(n_new, block)), ("k_new", "v_new", "k_cache", "v_cache", "cache_seqlens", "block_table"),
            args.pop(0), dict(BLOCK=block, num_warps=4, **common)))
    if not args:
        return launches
    merge = call.merge
    rows = merge_rows(splits, dv_pad, block_m)
    launches.append(Launch(
        _DECODE, (b * h_kv, row_tiles, splits),
        ("q", "k_cache", "v_cache", "dst", "dst_lse", "cache_seqlens", "block_table", "alibi", "sinks", "leftpad",
         "out", "lse", "counts"),
        args[0],
        dict(BLOCK_M=block_m, BLOCK_N=DECODE_BLOCK_N, ONE_PAGE=paged and page_size % DECODE_BLOCK_N == 0,
             SPLIT=splits > 1, MERGE=merge, MERGE_ROWS=rows if merge else 1,
             MERGE_SPLITS_PAD=_pow2(splits) if merge else 2,
             CAUSAL=var.causal, WINDOW=var.window, SOFTCAP=var.softcap, ALIBI=env["alibi"] is not None,
             SINKS=env["sinks"] is not None, DOT_PRECISION=dot_precision(q.dtype),
             UPCAST=upcast(q.dtype), LENGTHS=env["cache_seqlens"] is not None, LEFTPAD=env["leftpad"] is not None,
             CHECK=check, **(dict(debug=True, sanitize_overflow=False) if check else {}), num_warps=DECODE_WARPS,
             num_stages=decode_stages(b * h_kv * row_tiles, splits, q.device), **common)))
    if splits > 1 and not merge:
        launches.append(Launch(
            _COMBINE, (cdiv(b * h * n_q, rows),), ("dst", "dst_lse", "out", "lse", "sinks"), args[1],
            dict(HEAD_DIM_V=dv, HEAD_DIM_V_PAD=head_dim_pad(dv), SPLITS_PAD=_pow2(splits),
                 SINKS=env["sinks"] is not None, ROWS=rows, num_warps=4)))
    return launches


def _kept_names(call: CallLayout, need_lse: bool) -> tuple[str, ...]:
    """The kept buffers a FastKV's C++ call is given (_kept_inputs), by the names its launches read."""
    names = () if need_lse else ("lse",)
    if call.splits == 1:
        return names
    return names + (("dst", "dst_lse", "counts") if call.merge else ("dst", "dst_lse"))


def _kept_inputs(q: torch.Tensor, call: CallLayout, keep: tuple, need_lse: bool) -> tuple:
    """The kept buffers of _kept_names, as _outputs and _partials take them for an eager call (keep; the C++
    call's out has q's head_dim)."""
    kept = () if need_lse else (_kept_lse(q, keep),)
    if call.splits == 1:
        return kept
    dst, dst_lse = _kept_partials(q, call, keep, q.shape[-1])
    return kept + ((dst, dst_lse, _kept_counts(q, call, keep)) if call.merge else (dst, dst_lse))


def _kept_partials(q: torch.Tensor, call: CallLayout, keep: tuple, dv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A split call's kept fp32 partials: its outputs (rows x dv) and their lse (rows), rows = B H N_q splits."""
    rows = q.shape[0] * q.shape[1] * q.shape[2] * call.splits
    return _kept(q, keep, "out", rows * dv), _kept(q, keep, "lse partials", rows)


def _kept_counts(q: torch.Tensor, call: CallLayout, keep: tuple) -> torch.Tensor:
    """A merging call's kept counters, one int32 zero a row tile."""
    return _kept(q, keep, "counts", call.tiles, zeros=True)


def _partials(q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, call: CallLayout, keep: tuple | None) -> dict:
    """Where the decode kernel writes: out and lse themselves (one split), or fp32 partials, contiguous (B,
    H, N_q, splits, D_v) and (B, H, N_q, splits), that the merge (or the combine kernel) merges into them,
    and the merge's counters ("counts", one int32 zero a row tile: call.tiles): the leading elements of
    buffers kept per device, stream and thread (_kept) where `keep` (keep_scratch and _keeps: an eager CUDA
    call of the API), fresh ones otherwise. A launch that reads no counters gets a stand-in pointer."""
    splits = call.splits
    if splits == 1:
        return {"dst": out, "dst_lse": lse, "counts": lse}  # (no counts read: a stand-in pointer)
    b, h, n_q = q.shape[:3]
    rows = b * h * n_q * splits
    if not call.merge:
        counts = lse
    elif keep is not None:
        counts = _kept_counts(q, call, keep)
    else:  # (a merging plan replayed while a CUDA graph is captured: FastKV)
        counts = torch.zeros(call.tiles, dtype=torch.int32, device=q.device)
    if keep is not None:
        dst, dst_lse = _kept_partials(q, call, keep, out.shape[-1])
        return {"dst": dst, "dst_lse": dst_lse, "counts": counts}
    return {"dst": torch.empty(rows * out.shape[-1], dtype=torch.float32, device=q.device),
            "dst_lse": torch.empty(rows, dtype=torch.float32, device=q.device), "counts": counts}


# Buffers that only the launches of one call use (split-KV's partials, which the decode kernel writes and
# its merge or the combine kernel reads; the merge's counters, zero between calls; an lse nobody asked for),
# kept per device, stream and thread between eager calls: a torch.empty costs ~5-7 us of the H200 host's
# time (bench/results/host_budget_h200.txt), and a B1 decode step three or four of them, against ~17-25 us
# of GPU time. Launches on one stream run in order, so a call's kernels write these after the previous
# call's kernels read them; a call on another stream gets buffers of its own, and so does a call from
# another thread (two threads launching on one stream could interleave one call's partials and counters
# with another's), and a call while a CUDA graph is captured gets fresh ones (the graph's pool holds them),
# as do calls through the op (attention_kvcache's keep_scratch: a CUDA-graph tree's warmup would find a
# kept buffer live in its pool and refuse to record). A buffer only
# grows: split-KV's partials are B x H x N_q x splits x (D_v + 1) fp32, where B x H_kv x row tiles x splits
# is at most the GPU's SMs (four times that for a paged cache) unless num_splits asks for more.
_KEPT: dict[tuple, torch.Tensor] = {}
MAX_KEPT = 256  # buffers (four a stream and thread): a program with ever-new streams or threads starts over
# (a freed buffer returns to the pool of the stream it was allocated on)


def _keeps(q: torch.Tensor) -> tuple | None:
    """Where this call's scratch buffers come from in _KEPT, (device index, current stream, thread), for an
    eager CUDA call; None where nothing is kept (the interpreter, a CUDA graph being captured). Found once a
    call: each _kept of the call takes it."""
    if PLAIN or not q.is_cuda or torch._C._cuda_isCurrentStreamCapturing():  # (the torch.cuda function's body)
        return None
    index = q.get_device()
    return index, current_stream(index), get_ident()


def _kept(q: torch.Tensor, where: tuple, slot: str, numel: int, zeros: bool = False) -> torch.Tensor:
    """The kept fp32 buffer `slot` of `where` (_keeps: q's device, the current stream and thread), at least
    numel long (contiguous; the kernels use its leading numel elements); zeros: int32 zeros (MERGE's counters,
    which the decode kernel leaves zero)."""
    key = (*where, slot)
    buf = _KEPT.get(key)
    if buf is None or buf.numel() < numel:
        size = max(numel, 0 if buf is None else buf.numel())
        buf = remember(_KEPT, key, torch.zeros(size, dtype=torch.int32, device=q.device) if zeros else
                       torch.empty(size, dtype=torch.float32, device=q.device), MAX_KEPT)
    return buf


keep("kv-cache plans", lambda: (_KV_PLANS,))
keep("kv-cache length classes", lambda: (_CLASSES,))
keep("kept decode buffers", lambda: (_KEPT,),
     ("kept decode bytes", lambda stores: sum(t.numel() * t.element_size() for s in stores for t in s.values())))
keep("kv-cache bound kernels", lambda: [lc._compiled for lc in (_APPEND, _DECODE, _COMBINE)])

