"""Where the Hopper forward (forward_sm90.py) and backward (backward_sm90.py), warp-specialized Gluon kernels,
run instead of the portable ones, and their launch. attention_bwd asks `backward_runs` (below); attention_fwd
asks `tiles` per call, whose answer is None unless all of these hold:

- the backend: DIYFLASH_ATTENTION_BACKEND (read at import; `use` sets it in a running process) is "auto"
  (the default: the Hopper kernel where it measured faster, AUTO_MIN_KEYS), "hopper" (every
  head dim it has tiles for, TILES: for tests and benchmarks) or "portable" (never);
- the device: compute capability 9.0, a Triton whose Gluon Hopper API this kernel was checked with
  (TESTED_TRITON; DIYFLASH_ATTENTION_BACKEND=hopper tries another), decided once per device (`status`);
- the call: fp16 or bf16, D = Dv with tiles, no seq_lens or packed sequences, no ALiBi or sinks, no tiles
  asked for, and inputs TMA reads in place (tma_ok, host_descriptors_ok). Every other call runs the
  portable kernels, with the same semantics (tests/test_hopper.py checks which kernel each call ran).

bf16 (every dtype whose raw q.k can leave fp32's range: launch.overflow_passes) runs in one pass, PASS 3:
each consumer multiplies its query rows in shared memory by the power of two of the scale once a tile
(semantics._prescaled), as the portable forward's prescaled pass does in registers, so no dot overflows
where the scaled score does not."""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch

from .._runtime import clear_caches, device_limits

BACKENDS = ("auto", "hopper", "portable")
_backend = os.environ.get("DIYFLASH_ATTENTION_BACKEND", "auto").strip().lower()
if _backend not in BACKENDS:
    raise ValueError(f"DIYFLASH_ATTENTION_BACKEND={_backend!r}: expected one of {', '.join(BACKENDS)}")

# Triton versions this kernel's Gluon API was checked with: 3.6 runs it on the H200 (the GPU suite), 3.9
# compiles it for sm_90a (tests/test_hopper.py in CI). Gluon is experimental and moves between releases.
TESTED_TRITON = ("3.6", "3.9")

CONSUMER_ROWS = 64  # query rows a consumer warpgroup holds (one wgmma row tile), and the rows the kernel marks


class Tiles(NamedTuple):
    """A head dim's tiles: BLOCK_N keys a block in STAGES shared-memory slots, CONSUMERS warpgroups of
    CONSUMER_ROWS query rows each (a program's BLOCK_M rows); turns: whether the consumers issue their matmuls
    in turns (the kernel's TURNS) on calls without causal or window masks; serial: whether, on calls with them,
    a consumer's softmax waits for its p @ v too (the kernel's SERIAL: forward_sm90._consume)."""

    block_n: int
    stages: int
    consumers: int = 2
    turns: bool = False
    serial: bool = False

    @property
    def block_m(self) -> int:
        return self.consumers * CONSUMER_ROWS

    def meta(self, n_k: int, banded: bool) -> dict:
        """The kernel's tile constexprs for N_k keys, banded: a causal or window mask: the consumers share the
        register file (setmaxnreg; the loader warp keeps 24), 240 a thread for two, 160 for three."""
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, STAGES=self.stages, EVEN_N=n_k % self.block_n == 0,
                    CONSUMERS=self.consumers, CONSUMER_REGS={2: 240, 3: 160}[self.consumers],
                    TURNS=self.turns and not banded, SERIAL=self.serial and banded)


# Tiles per head dim (H200, Triton 3.6, bench/results/attention_sm90.jsonl; docs/performance.md, "Attention
# forward on Hopper", has every run). D128: 128-key blocks in 2 slots (3 ran within the noise). D64: three
# consumers (192 rows a program, as FA3 tiles D64), in turns on calls without masks (1.026-1.061x cuDNN on five
# D64 cells, run "consumers in turns at D64"; at D128 turns do not pay), and on calls with masks each block's
# softmax after its p @ v as well (serial: the three consumers' softmaxes run under each other's matmuls; MHA
# D64 causal 1.023x -> 1.063x cuDNN, run "the softmax outside p @ v's wait").
TILES = {64: Tiles(128, 3, 3, turns=True, serial=True), 128: Tiles(128, 2)}
# A sliding window's tiles where they differ, on windows whose rows see fewer than WINDOW_MAX_KEYS keys on
# average (contract.mean_keys; D64: every window): 64-key blocks. A consumer's 64 rows and a w-key window span
# 64 + w keys, so smaller blocks compute fewer keys past the window's edges and give a short band more blocks to
# pipeline (D64, causal window 256 at N16384: 0.63x -> 0.98x FlexAttention, attention_sm90.jsonl, run "d64 window
# blocks"). At D128 the 128-key blocks' longer matmuls win from 1024 keys (0.95x there on 64-key blocks, run "d128
# window blocks"): hence 768, between 512 and 1024.
WINDOW_TILES = {64: Tiles(64, 6, 3, serial=True), 128: Tiles(64, 3, 2)}
WINDOW_MAX_KEYS = {128: 768}


def head_dim_tiles(d: int, window: bool, keys: float = 0.0) -> Tiles:
    """The tiles of a call at head dim d (window: it has a sliding window, whose query rows see `keys` keys on
    average): WINDOW_TILES' where it has them for that many keys."""
    if window and d in WINDOW_TILES and keys < WINDOW_MAX_KEYS.get(d, math.inf):
        return WINDOW_TILES[d]
    return TILES[d]


# "auto": the head dims it runs the Hopper forward at, and the fewest keys a query row must see on average
# (contract.mean_keys). D64 pays its tiles' start and end only over long enough rows: at 1024 keys a row (causal)
# it ran 0.92x the portable kernel (H200, attention_sm90.jsonl, run "held rows").
AUTO_MIN_KEYS = {64: 2048, 128: 0}
# A call with a sliding window: its rows see about the window's keys each, and the portable kernel is slow on
# windows: at D64 (causal windows, N16384) on WINDOW_TILES the Hopper kernel ran 1.31x the portable one at 128
# keys a row (attention_sm90.jsonl, run "d64 short window routes"). Shorter windows are not measured: they keep
# the portable kernel.
AUTO_MIN_WINDOW_KEYS = {64: 120, 128: 0}
# "auto" leaves short calls (less work than plans.HOST_DESC_MIN_WORK, Z*H*N_q*N_k*D) to the portable kernel,
# which builds no host descriptors for them: the Hopper kernel's three (Gluon's TensorDescriptor, then
# Triton's encoding at each launch) made a B1 H32 N128 D128 bf16 forward cost 69 us a call in a loop against
# the portable route's 36 us, whose GPU time is 15 us (H200, bench/results/hopper_threshold_h200.jsonl). That
# was measured while the maps were encoded at every launch; the C launcher encodes a bound launch's maps once,
# and the threshold has not been measured since.


def schedule(num_tiles: int, num_bh: int, causal: bool, device: torch.device) -> tuple[int, int]:
    """The persistent kernel's (programs, head group) for num_tiles tiles of each of num_bh (batch, head)
    pairs: a program per SM (one fits: its shared memory), fewer for fewer tiles. Causal tiles, of unequal
    work, are dealt back and forth over a head group (tile_order._turn): the fewest heads that divide num_bh
    and hold two tiles per program, so every program takes a heavy and a light one of each group. (Taken in
    plain turns, one tile per program after the other, the heavy ones piled up on some programs: the MHA
    D128 causal B2 H16 N8192 forward 543 -> 462 TFLOPS, bench/results/attention_sm90.jsonl. More heads a group
    lose L2: 16 took that cell from 1.098x to 1.065x cuDNN, run "causal head group".)"""
    total = num_tiles * num_bh
    programs = max(1, min(total, device_limits(device).sms or total))
    if not causal:
        return programs, 1
    group = next(g for g in range(1, num_bh + 1) if num_bh % g == 0 and (g * num_tiles >= 2 * programs or g == num_bh))
    return programs, group


class Split(NamedTuple):
    """How the forward's last round of tiles is cut (tile_order._work): split_blocks key blocks a program, tiles
    of the last round (rest, from the tile first_lin on) in at most max_pieces pieces each."""

    split_blocks: int
    max_pieces: int
    first_lin: int
    rest: int


# A split's cost beside its runs of key blocks, counted in key blocks a program: a piece's start (its rows
# loaded, the pipeline filled) and end (its fp32 rows stored), and the merge launch. On MHA D128 full fp16 B2
# H16 N8192 (15.52 rounds) the split ran 1.006x the whole tiles, less than the 2.9 % this count predicts (H200,
# bench/results/attention_sm90.jsonl, run "split last round"; a last round on fewer SMs may meet a higher clock
# under the power cap).
SPLIT_PIECE_BLOCKS = 2
SPLIT_MIN_GAIN = 0.01  # the least share of the call's time a split must save, by that count
SPLIT_MAX_PIECES = 8  # the most pieces a tile is cut into (the merge adds them in a static unroll)


def split(num_tiles: int, num_bh: int, blocks: int, programs: int, banded: bool) -> Split | None:
    """Whether a persistent forward of num_tiles x num_bh tiles of `blocks` key blocks each (tiles of equal work:
    not banded, causal or windowed) on `programs` programs cuts its last round into runs of key blocks, one a
    program (tile_order._work), and how; None where the whole tiles take about as long. Tiles in turns leave a
    last round of rest < programs tiles, whose time the idle programs then wait out; its rest x blocks key
    blocks in programs runs take a program ceil(rest x blocks / programs) blocks (runs long enough that no tile
    falls in more than SPLIT_MAX_PIECES) and SPLIT_PIECE_BLOCKS."""
    total = num_tiles * num_bh
    whole, rest = divmod(total, programs)
    if banded or rest == 0 or whole == 0 or blocks < 2:
        return None
    run = max(-(-rest * blocks // programs), -(-blocks // (SPLIT_MAX_PIECES - 1)))
    if (whole * blocks + run + SPLIT_PIECE_BLOCKS) > (1 - SPLIT_MIN_GAIN) * (whole + 1) * blocks:
        return None
    pieces = max(((r + 1) * blocks - 1) // run - (r * blocks) // run + 1 for r in range(rest))
    return Split(run, pieces, whole * programs, rest)


def use(backend: str) -> None:
    """Choose the attention forward's backend in this process ("auto", "hopper", "portable"), as
    DIYFLASH_ATTENTION_BACKEND does at import. Forgets the kept launch plans, which bound the other's kernels,
    and the devices' status, which depends on the choice ("hopper" tries untested Triton versions)."""
    global _backend
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    _backend = backend
    kernel_module.cache_clear()
    backward_module.cache_clear()
    _device_status.cache_clear()
    clear_caches()


def backend() -> str:
    return _backend


@functools.cache
def kernel_module():
    """forward_sm90 where this Triton has the Gluon Hopper API it uses, else the reason it is not used (str)."""
    try:
        import triton

        version = ".".join(triton.__version__.split(".")[:2])
        if version not in TESTED_TRITON and _backend != "hopper":
            return (f"Triton {triton.__version__} is not one the Hopper kernel was checked with "
                    f"({', '.join(TESTED_TRITON)}); DIYFLASH_ATTENTION_BACKEND=hopper tries it")
        from . import forward_sm90

        return forward_sm90
    except (ImportError, AttributeError) as e:
        return f"Triton's Gluon Hopper API is missing here ({type(e).__name__}: {e})"


@functools.cache
def _device_status(index: int) -> tuple[bool, str]:
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) != (9, 0):
        return False, f"the Hopper kernel needs compute capability 9.0; this GPU has {major}.{minor}"
    module = kernel_module()
    if isinstance(module, str):
        return False, module
    import triton

    return True, f"Gluon, warp-specialized (Triton {triton.__version__})"


def status(device: torch.device) -> tuple[bool, str]:
    """(whether the Hopper forward can run on `device`, why or why not), for `python -m diyflash`."""
    if _backend == "portable":
        return False, "DIYFLASH_ATTENTION_BACKEND=portable"
    if device.type != "cuda":
        return False, "not a CUDA device"
    return _device_status(device.index if device.index is not None else torch.cuda.current_device())


def tiles(q4, k4, v4, seq_lens, packed, alibi, sinks, overrides: bool, readable, short: bool = False,
          keys=lambda: float("inf"), window: bool = False) -> Tiles | None:
    """The Tiles where this call runs the Hopper forward, else None (see the module's docstring).
    q4, k4, v4: the (Z, H, N, D) views attention_fwd launches on; readable(): whether host TMA descriptors
    can read them in place (views.tma_ok and plans.host_descriptors_ok), asked last: every other GPU and
    call is answered without it. short: less work than plans.HOST_DESC_MIN_WORK ("auto" leaves it to the
    portable kernel); keys(): the keys a query row sees on average (contract.mean_keys), which "auto" asks
    of a head dim with AUTO_MIN_KEYS, or with a sliding window (window) AUTO_MIN_WINDOW_KEYS, and of every
    window (its tiles: head_dim_tiles)."""
    head_dims = TILES if _backend == "hopper" else AUTO_MIN_KEYS
    if (seq_lens is not None or packed is not None or sinks is not None
            or not _takes(q4, v4, alibi, overrides, short, head_dims)):
        return None
    d = q4.shape[-1]
    need = (AUTO_MIN_WINDOW_KEYS if window else AUTO_MIN_KEYS)[d] if _backend == "auto" else 0
    mean = keys() if need or window else math.inf
    if mean < need or not status(q4.device)[0] or not readable():
        return None
    return head_dim_tiles(d, window, mean)


def _takes(q4, v4, alibi, overrides: bool, short: bool, head_dims) -> bool:
    """The call conditions the Hopper forward and backward share (the module's docstring), before the device
    is asked: the backend, fp16/bf16 on CUDA, no ALiBi or tiles asked for, D = Dv in head_dims, and not a short
    call under "auto" (its host time decides, and the host descriptors cost it: see below AUTO_MIN_KEYS)."""
    if (_backend == "portable" or overrides or alibi is not None or not q4.is_cuda
            or q4.dtype not in (torch.float16, torch.bfloat16)):
        return False
    d = q4.shape[-1]
    return d == v4.shape[-1] and d in head_dims and not (short and _backend == "auto")


@functools.cache
def _smem_layout(rows: int, cols: int, dtype: torch.dtype):
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], {
        torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}[dtype])


def descriptor(t: torch.Tensor, shape: list, strides: list, block: list):
    """Gluon's host TMA descriptor over t with these (dense-where-size-1) shape and strides (plans.host_descriptor)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, shape, strides, block, _smem_layout(block[2], block[3], t.dtype))


# the launch's leading arguments, by env name: the merge's buffers (split_o, split_lse) where the call is split
# (split), else lse in their place (never read)
POINTERS = ("gluon_q", "gluon_k", "gluon_v", "gluon_out", "lse", "split_o", "split_lse")
UNSPLIT_POINTERS = POINTERS[:5] + ("lse", "lse")


def descriptors(block_n: int, d: int) -> tuple:
    """The host descriptors of a launch (plans.launch_chunks' descs): q, k, v and out, as gluon_q, gluon_k, gluon_v,
    gluon_out (the kernel stores each consumer's rows through the TMA unit from the query slot they came in by:
    out's blocks and shared layout are q's, out being like q)."""
    return (("q", CONSUMER_ROWS, d, True), ("k", block_n, d, True), ("v", block_n, d, True),
            ("out", CONSUMER_ROWS, d, True))


# the Hopper kernels' DirectLaunchers once made, by kernel name (launch.py keeps count of their bound kernels)
LAUNCHERS: dict = {}


def _launcher(module, name: str):
    """The DirectLauncher of kernel `name` of module() (imported only where it runs), made once."""
    if name not in LAUNCHERS:
        from .._launch import DirectLauncher

        LAUNCHERS[name] = DirectLauncher(getattr(module(), name))
    return LAUNCHERS[name]


def launcher():
    """The Hopper forward's DirectLauncher."""
    return _launcher(kernel_module, "_hopper_fwd_kernel")


# -- the backward (backward_sm90.py) --

# The Hopper backward's tiles by head dim (D = Dv): (query rows a step, a multiple of BWD_DQ_TILE: dq's flat
# accumulator holds tiles of that many rows; q/dout/stat stages; dq buffers a warpgroup, or for packed sequences
# dq tile buffers, that the MMA warpgroups and the writer take in turns; k and v in registers as s^T's and dp^T's
# A operands; the stats in s^T's and dp^T's accumulators). A program takes BWD_BLOCK_N keys. H200, Triton 3.6,
# bench/results/onepass_backward_h200.jsonl (docs/performance.md, "Attention backward on Hopper", has every run):
# - two dq buffers: 1.006-1.016x one at D64 (run "dq buffers a warpgroup"); D128's fit, with 1.4 KiB of shared
#   memory to spare, and did not pay, nor with each tile handed over late (0.976-0.998x, run "bwd dq late, D128
#   two buffers");
# - k and v in registers (read from shared memory once, not every step): 1.025-1.063x at D64 (run "kv in
#   registers"); at D128 they spill and serialize every wgmma (offline sm_90a builds);
# - the stats in the accumulators (p and ds load nothing after the matmuls' waits): 1.030-1.048x at D128 (run
#   "bwd stats in acc"); at D64 no gain, so off.
# Other head dims keep the portable backward.
BWD_TILES: dict[int, tuple[int, int, int, bool, bool]] = {128: (64, 2, 1, False, True), 64: (64, 2, 2, True, False)}
# Calls without masks (not causal, no window, no softcap, not packed) at head_dim 64 take FlashAttention-3's D64
# tile instead: 128 query rows a step (each MMA warpgroup's s^T and dp^T 64 keys x 128 rows), k and v from shared
# memory (in registers beside those tiles they spill and serialize every wgmma, offline sm_90a), the stats in the
# accumulators: 1.012-1.027x the 64-row tile on three D64 cells without masks (bench/results/onepass_backward_h200.jsonl,
# run "bwd m128"; causal calls lost).
BWD_WIDE_TILES: dict[int, tuple[int, int, int, bool, bool]] = {64: (128, 2, 1, False, True)}
BWD_HEAD_DIMS = tuple(sorted(BWD_TILES))
BWD_BLOCK_N = 128  # keys a program, two MMA warpgroups of 64 (the kernel reads it off k's descriptor)
BWD_MMA_REGS = 240  # an MMA warpgroup's registers a thread (setmaxnreg; the loader and writer keep 32)
BWD_DQ_PANEL = 32  # packed sequences' dq columns a TMA reduce: 128 bytes of fp32, the widest swizzled box
BWD_DQ_TILE = 64  # rows of a tile of dq's flat accumulator (one wgmma row tile: backward_sm90._store_dq's order)


def bwd_wide(d: int, *, causal: bool, window: bool, softcap: bool, packed: bool) -> bool:
    """Whether a backward call at head dim d takes BWD_WIDE_TILES: none of causal, a window, softcap or packed
    sequences."""
    return d in BWD_WIDE_TILES and not (causal or window or softcap or packed)


def bwd_meta(d: int, wide: bool = False, softcap: bool = False) -> dict:
    """The Hopper backward kernel's tile constexprs and num_warps at head dim d (BWD_TILES, or wide:
    BWD_WIDE_TILES). STATS_ACC is off with softcap, whose scores need the raw dot; the preprocess stores the
    stats shifted exactly where it is on (launch_bwd)."""
    block_m, stages, dq_bufs, kv_regs, stats_acc = (BWD_WIDE_TILES if wide else BWD_TILES)[d]
    return dict(BLOCK_M=block_m, STAGES=stages, DQ_BUFS=dq_bufs, MMA_REGS=BWD_MMA_REGS, KV_REGS=kv_regs,
                STATS_ACC=stats_acc and not softcap, num_warps=4)


@functools.cache
def backward_module():
    """backward_sm90 where the forward's Gluon API is here (kernel_module), else why not (str)."""
    module = kernel_module()
    if isinstance(module, str):
        return module
    try:
        from . import backward_sm90

        return backward_sm90
    except (ImportError, AttributeError) as e:
        return f"Triton's Gluon Hopper API is missing here ({type(e).__name__}: {e})"


def backward_launcher():
    """The Hopper backward's DirectLauncher."""
    return _launcher(backward_module, "_hopper_bwd_kernel")


def backward_runs(q4, v4, seq_lens, packed, alibi, overrides: bool, deterministic: bool, one_pass, readable,
                  short: bool = False, program_rows: int | None = None) -> bool:
    """Whether this backward call runs the Hopper backward: as the forward's `tiles` (backend, device, fp16 or
    bf16, no ALiBi, no tiles asked for, inputs TMA reads in place, short calls left to the portable kernels
    under "auto", and so are calls whose programs walk fewer query rows than BWD_MIN_ROWS: program_rows, a kv
    head's query heads x the longest sequence), a head dim of BWD_HEAD_DIMS with D = Dv, and determinism not
    asked for (its dq is added up in any order) nor the two-kernel backward (one_pass=False). seq_lens run
    here, and sinks need nothing: the saved lse includes them, and packed sequences (at most
    MAX_PACKED_SEQUENCES: a grid slice each) too."""
    few_rows = program_rows is not None and program_rows < BWD_MIN_ROWS.get(q4.shape[-1], 0)
    if deterministic or one_pass is False or not _takes(q4, v4, alibi, overrides, short or few_rows, BWD_HEAD_DIMS):
        return False
    if packed is not None and seq_lens.shape[0] - 1 > MAX_PACKED_SEQUENCES:
        return False
    return status(q4.device)[0] and not isinstance(backward_module(), str) and readable()


MAX_PACKED_SEQUENCES = 65535  # CUDA's cap on a grid's z dimension: the kernel takes a sequence a slice
# "auto" also leaves to the portable kernels a backward whose programs walk fewer query rows than this (a kv
# head's query heads x the longest sequence: backward_runs' program_rows): at head_dim 64, causal, the Hopper
# backward ran 0.96x the portable kernels' speed at 512 rows and 1.03x at 768, by GPU time (H200,
# bench/results/onepass_backward_h200.jsonl, run "short calls, GPU time"); head_dim 128 wins from 256 rows.
BWD_MIN_ROWS = {64: 768}
# A causal GQA backward (no window) of BWD_GROUP_MIN_ROWS query rows or more splits each kv head's query-head
# group so that a program walks at most BWD_GROUP_HEADS query heads (grids.head_split; dk and dv then fp32
# partials that one more launch adds up): a causal grid's programs start and end at different rows, and the fewer
# heads a program walks a row block, the sooner the next program reads the rows they share, while L2 still holds
# them: GQA 64/8 D128 causal bf16 B1 N16384 523 -> 546 TFLOPS on the H200, at 4096 rows no gain
# (bench/results/onepass_backward_h200.jsonl, run "two heads a program").
BWD_GROUP_HEADS = 2
BWD_GROUP_MIN_ROWS = 8192


def stat_rows(n_q: int) -> int:
    """Rows a head of the backward's delta and lse2 take for the Hopper backward: N_q rounded up to 4, so each
    head's rows start 16-byte aligned (the TMA reads them in 64-row blocks of the flat buffer)."""
    return (n_q + 3) // 4 * 4


def _stat_descriptor(t: torch.Tensor, block_m: int):
    """A TMA descriptor over the whole flat (Z, H, stat_rows) fp32 buffer t in block_m blocks."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, [t.numel()], [1], [block_m],
                            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1))


# the backward launch's leading arguments by env name (the descriptors of bwd_descriptors), then dk and dv's
BWD_POINTERS = ("gluon_k", "gluon_v", "gluon_q", "gluon_dout", "gluon_lse2", "gluon_delta", "gluon_dq_acc")


def _flat_descriptor(t: torch.Tensor, rows: int):
    """A TMA descriptor over the fp32 tensor t's floats in rows of 256, in (rows, 256) blocks (unswizzled)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, [t.numel() // 256, 256], [256, 1], [rows, 256],
                            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


def bwd_dq_rows(n_q: int, packed: bool) -> int:
    """Rows a head of the Hopper backward's fp32 dq accumulator: N_q rounded up to BWD_DQ_TILE rows,
    each MMA warpgroup's half a flat chunk in its registers' order (backward_sm90._store_dq); packed
    sequences, whose tiles start at any row, N_q (swizzled panels, clipped by the TMA)."""
    return n_q if packed else -(-n_q // BWD_DQ_TILE) * BWD_DQ_TILE


def bwd_descriptors(d: int, packed: bool = False, wide: bool = False) -> tuple:
    """The backward launch's host descriptors (plans.launch_chunks' descs): k, v, q, dout, the fp32 dq
    accumulator (a warpgroup's half of a BWD_DQ_TILE-row tile, a block; packed: BWD_DQ_PANEL-column
    panels of its (Z, H, N_q, D) view), and the flat row statistics (specs with a function:
    plans._with_descriptors); wide: bwd_meta's."""
    block_m = bwd_meta(d, wide)["BLOCK_M"]
    stats = functools.partial(_stat_descriptor, block_m=block_m)
    dq = (("dq_acc", block_m, BWD_DQ_PANEL, True) if packed
          else ("dq_acc", functools.partial(_flat_descriptor, rows=BWD_DQ_TILE * d // 2 // 256)))
    return (("k", BWD_BLOCK_N, d, True), ("v", BWD_BLOCK_N, d, True), ("q", block_m, d, True),
            ("dout", block_m, d, True), dq, ("lse2", stats), ("delta", stats))
