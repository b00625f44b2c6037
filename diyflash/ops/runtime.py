"""What the API and the tools (selector, precompile, `python -m diyflash`) may ask of the kernels beyond
the ops: which path runs, which tiles a call takes, where the tuner keeps its choices, the host-speed
state (clear_caches, cache_info). They import this module and the ops, never diyflash.kernels
(tests/test_layering.py), so the kernels' insides can move without them."""

from __future__ import annotations

import functools

import torch

from ..kernels import cache_info, clear_caches, interpreter_active
from ..kernels.attention_configs import bwd_config, fwd_config, head_dim_pad
from ..kernels.attention_torch import BLOCK_N as PYTORCH_PATH_BLOCK_N
from ..kernels.matmul_configs import INTERPRETER_CONFIG as _MATMUL_INTERPRETER
from ..kernels.matmul_configs import MatmulConfig, manual_config, tma_layout
from ..kernels.matmul_configs import candidates as matmul_candidates
from ..kernels.tuning_cache import cache_dir as tuning_cache_dir
from ..kernels.tuning_cache import environment as tuning_environment


def attention_tiles(head_dim: int, dtype: torch.dtype, device: torch.device, causal: bool, interpret: bool,
                    seq_len: int | None) -> tuple[int, object, object]:
    """(padded head_dim, forward config, backward config) of a flash_attention call of this kind: the
    functions the launchers call."""
    pad = head_dim_pad(head_dim)
    return pad, fwd_config(pad, dtype, device, causal, interpret, seq_len), bwd_config(
        pad, dtype, device, causal, interpret, seq_len)


def attention_backend(device: torch.device, backward: bool = False) -> str:
    """Which kernels run the attention forward (or backward) on `device`, in words: the Hopper (Gluon) kernel
    and where it runs, or the portable Triton kernels and why (kernels/attention/hopper.py)."""
    from ..kernels.attention import hopper

    ok, why = hopper.status(device)
    if ok and backward:
        module = hopper.backward_module()
        if isinstance(module, str):
            return f"portable Triton kernels ({module})"
        where = "fp16/bf16, head_dim " + "/".join(map(str, hopper.BWD_HEAD_DIMS))
        rows = "".join(f", head_dim {d} from {n} rows a program" for d, n in hopper.BWD_MIN_ROWS.items()
                       if hopper.backend() == "auto")
        return f"hopper one-pass ({why}; {where} when not deterministic, no ALiBi{rows}; other calls portable)"
    if ok:
        if hopper.backend() == "auto":
            dims = sorted(hopper.AUTO_MIN_KEYS.items(), reverse=True)
            where = "fp16/bf16, head_dim " + "/".join(
                f"{d}" + (f" from {n} keys a row ({hopper.AUTO_MIN_WINDOW_KEYS[d]} with a window)" if n else "")
                for d, n in dims)
        else:
            where = "fp16/bf16, head_dim " + "/".join(map(str, sorted(hopper.TILES)))
        return f"hopper ({why}; {where}, no seq_lens/ALiBi/sinks; other calls portable)"
    return f"portable Triton kernels ({why})"


def matmul_interpreter_tiles() -> dict:
    """The matmul's pinned tiles under Triton's interpreter."""
    return _MATMUL_INTERPRETER.as_dict()


def check_matmul_tiles(block_m: int, block_n: int, block_k: int, a: torch.Tensor, b: torch.Tensor) -> None:
    """Raise ValueError where triton_matmul(a, b) cannot run with these block sizes."""
    manual_config(block_m, block_n, block_k, a.shape[0], b.shape[1], a.shape[1], a.dtype, a.device)


def matmul_choice(a: torch.Tensor, b: torch.Tensor) -> tuple[dict, bool]:
    """(config, whether its operands go through TMA) of triton_matmul(a, b) with the autotuner: tunes the
    shape bucket if this process and the disk cache have no choice for it yet."""
    from ..kernels import matmul as km

    cfg = km.select_config(a, b, allow_tf32=False, autotune=True)
    return cfg.as_dict(), cfg.use_tma and tma_layout(a, b) is not None


def matmul_with_tiles(a: torch.Tensor, b: torch.Tensor, tiles: tuple) -> torch.Tensor:
    """A @ B with one full tuner candidate (MatmulConfig's fields in order), as precompile compiles each."""
    from ..kernels import matmul as km

    return km.matmul(a, b, MatmulConfig(*tiles))


@functools.cache
def value_checks():
    """The kernels that check the API's values on the GPU without a sync (kernels/value_checks.py):
    check_seq_lens, check_cu_seqlens, check_kvcache. Imported at first use (it imports triton)."""
    from ..kernels import value_checks as checks

    return checks


__all__ = ["PYTORCH_PATH_BLOCK_N", "attention_tiles", "cache_info", "check_matmul_tiles", "clear_caches",
           "interpreter_active", "matmul_candidates", "matmul_choice",
           "matmul_interpreter_tiles", "matmul_with_tiles", "tuning_cache_dir", "tuning_environment", "value_checks"]
