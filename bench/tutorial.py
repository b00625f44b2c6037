"""The seed's Triton fused-attention tutorial as a benchmark baseline, loaded from the seed document.

Issue 5 asks diyflash to be nowhere slower than that kernel on the shapes it supports. Its code is not
part of diyflash: it is read at run time from the seed (the tutorial text with its Python), by default
../shared/seeds/000_triton_fused_attention_tutorial_zh.txt next to this checkout, or the file that
DIYFLASH_TUTORIAL_SEED names. What it supports, as written: fp16, head_dim 16..256 (powers of two),
N a multiple of 128, q/k/v of one layout; its backward always applies the causal mask, so only causal
backwards are comparable.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import types
from pathlib import Path

SEED_NAME = "000_triton_fused_attention_tutorial_zh.txt"


def seed_path() -> Path:
    env = os.environ.get("DIYFLASH_TUTORIAL_SEED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "seeds" / SEED_NAME


def tutorial_source(text: str) -> str:
    """The tutorial's kernels and autograd function: the Python from its first import up to its tests
    (the document around it is prose, and its tests and benchmark are not needed)."""
    start = text.index("import pytest")
    end = text.index("@pytest.mark.parametrize")
    return text[start:end].replace("import pytest\n", "", 1)


def load_tutorial(path: Path | None = None) -> types.ModuleType:
    """Import the tutorial's code. It goes through a real .py file: Triton's JIT reads each kernel's
    source back from the file its code object names."""
    path = path or seed_path()
    source = tutorial_source(path.read_text(encoding="utf-8"))
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    module_file = Path(tempfile.gettempdir()) / f"diyflash_seed_tutorial_{digest}.py"
    if not module_file.is_file():
        module_file.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"diyflash_seed_tutorial_{digest}", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tutorial_provider(path: Path | None = None):
    """A bench.attention provider running the tutorial, or None when its seed file is not here. It
    raises NotImplementedError outside the tutorial's own limits (the benchmark then skips the cell)."""
    import torch

    path = path or seed_path()
    if not path.is_file():
        return None
    loaded: list[types.ModuleType] = []  # imported on first use: a run without this provider never execs it

    def run(q, k, v, causal):
        d, n = q.shape[-1], q.shape[-2]
        if q.dtype != torch.float16:
            raise NotImplementedError("the tutorial's kernels write fp16 only")
        if d not in (16, 32, 64, 128, 256) or n % 128:
            raise NotImplementedError("the tutorial needs a power-of-two head_dim and N % 128 == 0")
        if q.requires_grad and not causal:
            raise NotImplementedError("the tutorial's backward is causal-only")
        if not loaded:
            loaded.append(load_tutorial(path))
        return loaded[0].attention(q, k, v, causal, d ** -0.5)

    return run
