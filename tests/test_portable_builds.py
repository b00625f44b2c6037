"""The portable attention kernels build for sm_90 (no GPU needed) in the forms a CPU run launched through Triton's
interpreter. The interpreter runs a kernel's Python; it does not check what the compiler checks (a loop-carried
value that changes its shape, for one: the forward's second pass once reused a name for its chunk's 2048 lse values
and a block's 64, and failed to build on the GPU only), so CI builds each launch too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from triton.runtime.jit import mangle_type

import diyflash
from diyflash.kernels import _launch
from diyflash.kernels.attention import launch
from helpers import ON_GPU, make_qkv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# each launch: Triton's signature and constants, compiled for sm_90a in a process without the interpreter
_BUILD = r"""
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
for c in json.load(sys.stdin):
    kernel = getattr(importlib.import_module(c["module"]), c["name"])
    names = kernel.arg_names
    consts = {(names.index(n),): v for n, v in c["consts"].items()}
    triton.compile(ASTSource(kernel, c["sig"], consts), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=c["num_warps"], num_stages=c["num_stages"]))
    print(c["name"], c["consts"].get("PASS"), "built", flush=True)
"""


def _launches(calls) -> list[dict]:
    """Each distinct launch of the calls (run through the interpreter) as _BUILD takes it."""
    seen, found = set(), []
    inner = _launch.DirectLauncher.__call__

    def spy(self, grid, *args, **meta):
        fn = getattr(self.kernel, "fn", self.kernel)
        names = self.kernel.arg_names
        meta = dict(meta)
        num_warps, num_stages = meta.pop("num_warps", 4), meta.pop("num_stages", 3)
        values = dict(zip(names, args), **meta)
        sig = {n: "constexpr" if n in meta else mangle_type(values[n]) for n in names}  # None: constexpr
        consts = {n: values[n] for n in names if sig[n] == "constexpr"}
        entry = dict(module=fn.__module__, name=fn.__name__, sig=sig, consts=consts, num_warps=num_warps,
                     num_stages=num_stages)
        key = json.dumps(entry, sort_keys=True)
        if key not in seen:
            seen.add(key)
            found.append(entry)
        return inner(self, grid, *args, **meta, num_warps=num_warps, num_stages=num_stages)

    _launch.DirectLauncher.__call__ = spy
    try:
        for call in calls:
            call()
    finally:
        _launch.DirectLauncher.__call__ = inner
    return found


@pytest.mark.skipif(ON_GPU, reason="on the GPU every test builds what it launches")
def test_portable_attention_kernels_build_for_sm90(monkeypatch):
    """A bf16 causal forward and backward in two passes (the first pass marks, the second runs the marked
    blocks: launch.overflow_passes), dense and packed, with rows whose raw q.k leaves fp32's range: every
    kernel they launch builds for sm_90a."""
    monkeypatch.setattr(launch, "PRESCALED_MAX_WORK", 0)
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in make_qkv(1, 2, 100, 100, 64, torch.float32, "cpu"))
    with torch.no_grad():
        q[:, :, 70, 0] = 3e19
        k[:, :, 3, 0] = 3e19
    cu = torch.tensor([0, 40, 100], dtype=torch.int32)
    packed = [t.detach()[0].transpose(0, 1).contiguous() for t in (q, k, v)]

    def dense():
        out = diyflash.flash_attention(q, k, v, causal=True)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    diyflash.clear_caches()
    found = _launches([dense, lambda: diyflash.flash_attention_varlen(*packed, cu, cu, 60, 60, causal=True)])
    diyflash.clear_caches()
    names = {f["name"] for f in found}
    assert {"_attn_fwd_kernel", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel"} <= names, names
    assert {f["consts"].get("PASS") for f in found if f["name"] == "_attn_fwd_kernel"} == {1, 2}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _BUILD], input=json.dumps(found), cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("built") == len(found), run.stdout
