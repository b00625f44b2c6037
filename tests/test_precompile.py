"""diyflash.precompile and `python -m diyflash precompile` (issue 22): the calls a job will make, run once
in parallel worker processes so that Triton's disk cache holds their kernels. On CPU the same calls run
through the interpreter (nothing is compiled there), which tests the job list, the worker pool and the
progress lines; the GPU suite and bench/coldstart.py measure what it saves."""

import subprocess
import sys

import pytest
import torch

import diyflash
from diyflash.precompile import Job, attention_jobs, matmul_jobs, precompile_jobs
from helpers import ON_GPU


def test_jobs_cover_each_variant():
    jobs = attention_jobs(["fp16", "bf16"], [64, 80], [False, True], [(2, 4, 100), (1, 2, 17, 33)])
    assert len(jobs) == 2 * 2 * 2 * 2
    assert Job("attention", "bf16", (1, 2, 17, 33, 80), causal=True) in jobs
    assert matmul_jobs(["fp16"], [(30, 40, 50)], autotune=False) == [Job("matmul", "fp16", (30, 40, 50))]
    assert "causal +bwd" in jobs[2].label() and "2x4x100x100x64" in jobs[0].label()


def test_gqa_and_window_jobs():
    """GQA calls and sliding windows run kernels of their own: each kv_heads value and window is a job of
    every shape; kv_heads equal to the query heads is the plain call, and one that does not divide them is
    refused up front, naming both."""
    jobs = attention_jobs(["bf16"], [64], [True], [(1, 4, 100)], kv_heads=(0, 4, 2), windows=((-1, -1), (31, 0)))
    assert len(jobs) == 4 and {(j.kv_heads, j.window) for j in jobs} == {(0, (-1, -1)), (0, (31, 0)),
                                                                         (2, (-1, -1)), (2, (31, 0))}
    assert [j.label() for j in jobs if j.kv_heads and j.window != (-1, -1)] == [
        "attention bf16 1x4/2x100x100x64 causal window (31, 0) +bwd"]
    with pytest.raises(ValueError, match="kv_heads 4 does not divide the 6 query heads of shape 1x6x10"):
        attention_jobs(["bf16"], [64], [True], [(1, 6, 10)], kv_heads=(4,))


@pytest.mark.skipif(ON_GPU, reason="CPU: the interpreter runs the calls (the GPU suite compiles for real below)")
def test_a_gqa_window_job_makes_that_call(device):
    lines = []
    diyflash.precompile(dtypes=("fp16",), head_dims=(16,), causal=(True,), shapes=((1, 4, 20),), kv_heads=(2,),
                        windows=((5, 0),), workers=1, device="cpu", log=lines.append)
    assert any("attention fp16 1x4/2x20x20x16 causal window (5, 0) +bwd" in line for line in lines[1:]), lines


@pytest.mark.skipif(ON_GPU, reason="CPU: the interpreter runs the calls (the GPU suite compiles for real below)")
def test_precompile_runs_every_call_in_worker_processes(device):
    lines = []
    seconds = diyflash.precompile(dtypes=("fp16",), head_dims=(16,), causal=(True,), shapes=((1, 2, 20),),
                                  matmul_shapes=((20, 16, 24),), workers=2, device="cpu", log=lines.append)
    assert seconds > 0
    assert lines[0] == "precompile: 2 calls in 2 processes"
    assert len(lines) == 3 and all("s] " in line for line in lines[1:]), lines
    assert any("attention fp16 1x2x20x20x16 causal +bwd" in line for line in lines)


def test_a_failing_call_names_its_job(device):
    bad = Job("attention", "fp16", (1, 1, 8, 8, 12))  # head_dim 12: refused by the API
    with pytest.raises(RuntimeError, match="precompile: attention fp16 1x1x8x8x12 full \\+bwd failed"):
        precompile_jobs([bad], workers=1, device=device.type, log=None)


def test_the_variants_job_makes_the_main_jobs_variants_call(device):
    """Job(variants=True) runs utils.validation.variants_cell's call (GQA 4/2, D_v != D, window, softcap,
    ALiBi, sinks) with its backward, as `python -m diyflash` validates it."""
    job = Job("attention", "fp16", (1, 4, 24, 29, 16), causal=True, variants=True)
    assert "1x4x24x29x16 every variant +bwd" in job.label()
    lines = []
    precompile_jobs([job], workers=1, device=device.type, log=lines.append)
    assert any("every variant" in line for line in lines[1:]), lines


def _fresh_process_compiles_nothing(tmp_path, precompile_code: str, call_code: str) -> None:
    """precompile_code in a process with an empty Triton cache compiles something; call_code in a fresh
    process after it compiles nothing (its kernels load from the disk cache)."""
    import os

    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "DIYFLASH_CACHE_DIR": str(tmp_path / "dyf")}
    done = subprocess.run([sys.executable, "-c", precompile_code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    cached = {p.name for p in (tmp_path / "triton").rglob("*.cubin")}
    assert cached, "nothing was compiled"
    done = subprocess.run([sys.executable, "-c", call_code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in (tmp_path / "triton").rglob("*.cubin")} == cached, "the fresh process compiled"


@pytest.mark.skipif(not ON_GPU, reason="compiles CUDA kernels")
def test_the_main_jobs_variants_cell_compiles_nothing_after_precompile(tmp_path):
    """The variants job in an empty Triton cache, then the main job's own variants check in a fresh process
    compiles nothing (it had compiled its kernels one after the other, outside the parallel precompile)."""
    _fresh_process_compiles_nothing(
        tmp_path,
        "from diyflash.precompile import Job, precompile_jobs\n"
        "precompile_jobs([Job('attention', 'bf16', (1, 4, 256, 261, 64), causal=True, variants=True)], workers=1)\n",
        "import torch\n"
        "from diyflash.__main__ import validate_variants_cell\n"
        "assert validate_variants_cell('cuda', torch.bfloat16, 64, 256, torch.Generator().manual_seed(0))\n")


@pytest.mark.skipif(not ON_GPU, reason="compiles CUDA kernels")
def test_precompile_fills_the_cache_a_fresh_process_uses(tmp_path):
    """Compiled in workers into an empty Triton cache, then a fresh process's first call compiles nothing:
    its kernels load from the disk cache (seconds, against compiling)."""
    _fresh_process_compiles_nothing(
        tmp_path,
        "import diyflash, torch\n"
        "diyflash.precompile(dtypes=('fp16',), head_dims=(64,), causal=(True,), shapes=((1, 2, 300),), workers=2)\n",
        "import diyflash, torch\n"
        "q = torch.randn(1, 2, 300, 64, device='cuda', dtype=torch.float16, requires_grad=True)\n"
        "o = diyflash.flash_attention(q, q, q, causal=True)\n"
        "o.sum().backward()\n")


@pytest.mark.skipif(not ON_GPU, reason="compiles CUDA kernels")
def test_a_gqa_window_call_compiles_nothing_after_precompile(tmp_path):
    """A GQA call with a sliding window, precompiled with its kv heads and window: a fresh process's first call
    (forward and backward) compiles nothing."""
    _fresh_process_compiles_nothing(
        tmp_path,
        "import diyflash\n"
        "diyflash.precompile(dtypes=('bf16',), head_dims=(64,), causal=(True,), shapes=((1, 4, 300),), kv_heads=(2,),\n"
        "                    windows=((64, 0),), workers=1)\n",
        "import diyflash, torch\n"
        "q = torch.randn(1, 4, 300, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
        "k, v = (torch.randn(1, 2, 300, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in 'kv')\n"
        "o = diyflash.flash_attention(q, k, v, causal=True, window_size=(64, 0))\n"
        "o.sum().backward()\n")


def test_cli():
    done = subprocess.run([sys.executable, "-m", "diyflash", "precompile", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "--shapes" in done.stdout
    for argv, phrase in ((["--shapes", "4x16"], "BxHxN"), (["--shapes", "4xax2"], "expected a shape"),
                         (["--head-dims", "12"], "Unsupported head_dim 12"),
                         (["--shapes", "4x16x4096", "--kv-heads", "3"],
                          "--kv-heads 3 does not divide the 16 query heads"),
                         (["--windows", "4095"], "expected a window like 4095,0"),
                         (["--windows=-2,0"], "window left must be -1 (unbounded) or >= 0, got -2")):
        done = subprocess.run([sys.executable, "-m", "diyflash", "precompile", *argv], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 2 and phrase in done.stderr, done.stderr
    if not torch.cuda.is_available():
        done = subprocess.run([sys.executable, "-m", "diyflash", "precompile"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0 and "nothing to compile" in done.stdout
