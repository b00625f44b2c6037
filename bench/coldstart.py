"""Cold start: how long a user waits for the first call, each case in a fresh process (issue 22).

    python -m bench.coldstart --out bench/results/coldstart_h200.jsonl

Every case runs twice in new processes that share fresh cache directories: first COLD (empty Triton
cache, empty Inductor cache, empty diyflash tuning cache: what a fresh machine sees), then WARM (the
caches the cold run left). A case reports the process's wall time from start to exit, and the time of
its first call alone (from the call to its results on the GPU, after `import torch`, torch's own first
backward and the inputs).

Python's bytecode is cached in both, as in an installed environment (pip compiles it at install): a
first run of the case with throwaway Triton/Inductor/diyflash caches fills PYTHONPYCACHEPREFIX, which the
cold and warm runs share, and PYTHONDONTWRITEBYTECODE is cleared for them. (The GPU machines' site-packages
is read-only and they set PYTHONDONTWRITEBYTECODE: otherwise every process compiles torch's modules from
source, 5.1 s of a warm main job under cProfile on the H200.) torch's first backward imports
torch.fx's symbolic shapes and sympy (3.4 s there without bytecode); every case pays it before the timer,
as a training script pays it once whatever its attention (FlexAttention's torch.compile paid it before
the timer already).

Cases (fp16):
- diyflash-attention: the first flash_attention forward + backward, B4 H16 N4096 D128 causal;
- diyflash-attention-precompiled: the same, after `python -m diyflash precompile` for that shape ran
  into the same (cold) cache directories, as a serving or CI image would at build time; the
  precompile's own time is its cold row;
- diyflash-varlen: the first flash_attention_varlen forward + backward, the same tokens as B packed
  sequences of N (causal);
- diyflash-matmul: the first triton_matmul at 4096^3 (it autotunes: every candidate compiles);
- main-job: `python -m diyflash` end to end;
- flex: FlexAttention's first torch.compile'd call (forward + backward) of the same attention with a
  causal block mask (building the mask included);
- tutorial: the seed's Triton tutorial's first call (forward + backward; its autotuner times its
  forward configs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

B, H, N, D = 4, 16, 4096, 128

_PRELUDE = f"""
import json, sys, time
t_start = time.perf_counter()
import torch
B, H, N, D = {B}, {H}, {N}, {D}
_w = torch.ones(2, device="cuda", requires_grad=True) * 2
_w.backward(torch.ones_like(_w))  # torch's own first backward with a given gradient (its lazy imports)
def inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g).requires_grad_() for _ in range(3)]
def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0
def report(first, second):
    print("COLDSTART " + json.dumps({{"first_call_s": first, "second_call_s": second,
                                      "in_process_s": time.perf_counter() - t_start}}))
"""

CASES = {
    "diyflash-attention": """
import diyflash
q, k, v = inputs()
def step():
    out = diyflash.flash_attention(q, k, v, causal=True)
    out.backward(torch.ones_like(out))
report(timed(step), timed(step))
""",
    "diyflash-varlen": """
import diyflash
q, k, v = (x.detach().transpose(1, 2).reshape(B * N, H, D).requires_grad_() for x in inputs())
cu = torch.arange(0, B * N + 1, N, device="cuda", dtype=torch.int32)
def step():
    out = diyflash.flash_attention_varlen(q, k, v, cu, cu, N, N, causal=True)
    out.backward(torch.ones_like(out))
report(timed(step), timed(step))
""",
    "diyflash-matmul": """
import diyflash
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
report(timed(lambda: diyflash.triton_matmul(a, b)), timed(lambda: diyflash.triton_matmul(a, b)))
""",
    "flex": """
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
flex = torch.compile(flex_attention)
q, k, v = inputs()
def step():
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, N, N, device="cuda")
    out = flex(q, k, v, block_mask=mask)
    out.backward(torch.ones_like(out))
report(timed(step), timed(step))
""",
    "tutorial": """
from bench.tutorial import load_tutorial
tut = load_tutorial()
q, k, v = inputs()
def step():
    out = tut.attention(q, k, v, True, D ** -0.5)
    out.backward(torch.ones_like(out))
report(timed(step), timed(step))
""",
}


def _run(argv: list[str], env: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    row = {"process_s": wall, "returncode": done.returncode}
    for line in done.stdout.splitlines():
        if line.startswith("COLDSTART "):
            row.update(json.loads(line[len("COLDSTART "):]))
    if done.returncode != 0:
        row["error"] = (done.stderr or done.stdout)[-2000:]
    if "validation:" in done.stdout:
        row["validation"] = "PASSED" if "validation: PASSED" in done.stdout else "FAILED"
    return row


def _env(root: Path, pycache: Path) -> dict:
    env = dict(os.environ)
    for name, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                      ("DIYFLASH_CACHE_DIR", "diyflash")):
        env[name] = str(root / sub)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # set on the GPU machines: no process would cache its bytecode
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def measure(case: str, root: Path, timeout: float) -> list[dict]:
    """The case's cold and warm rows, run in fresh processes over the cache directories under root, after
    a run over throwaway ones has filled the bytecode cache they share (the module's docstring)."""
    env = _env(root, root / "pycache")
    prime = _env(root / "prime", root / "pycache")
    rows = []
    if case == "main-job":
        argv = [sys.executable, "-m", "diyflash"]
    elif case == "diyflash-attention-precompiled":
        pre = [sys.executable, "-m", "diyflash", "precompile", "--dtypes", "fp16", "--head-dims", str(D),
               "--causal", "true", "--shapes", f"{B}x{H}x{N}"]
        argv = [sys.executable, "-c", _PRELUDE + CASES["diyflash-attention"]]
        _run(pre, prime, timeout)
        _run(argv, prime, timeout)
        rows.append({"case": "precompile", "cache": "cold", **_run(pre, env, timeout)})
        rows.append({"case": case, "cache": "warm", **_run(argv, env, timeout)})
        return rows
    else:
        argv = [sys.executable, "-c", _PRELUDE + CASES[case]]
    _run(argv, prime, timeout)
    for cache in ("cold", "warm"):
        rows.append({"case": case, "cache": cache, **_run(argv, env, timeout)})
    return rows


ALL = ["diyflash-attention", "diyflash-attention-precompiled", "diyflash-varlen", "diyflash-matmul", "main-job", "flex",
       "tutorial"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=ALL, default=ALL)
    p.add_argument("--out", type=Path, default=None, help="JSONL rows with provenance")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench.coldstart needs a GPU (it measures compilation)")
        return 1
    from bench.common import provenance

    prov = provenance()
    rows = []
    with tempfile.TemporaryDirectory(prefix="coldstart-") as tmp:
        for case in args.cases:
            for row in measure(case, Path(tmp) / case, args.timeout):
                row.update(prov)
                rows.append(row)
                first = row.get("first_call_s")
                print(f"{row['case']:<32} {row['cache']:<5} process {row['process_s']:7.1f} s"
                      + (f"   first call {first:7.2f} s   second {row['second_call_s']:.3f} s" if first else "")
                      + (f"   validation {row['validation']}" if "validation" in row else "")
                      + (f"   ERROR {row['error'][-300:]!r}" if "error" in row else ""), flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    print("\n" + readme_table(rows))
    return 0


def readme_table(rows: list[dict]) -> str:
    """The cold-start table (docs/performance.md): one line per case, cold and warm side by side."""
    by = {(r["case"], r["cache"]): r for r in rows}
    cases = list(dict.fromkeys(r["case"] for r in rows))
    runs = len({r.get("run") for r in rows}) > 1  # rows of several runs (machines): each line says its run
    fmt = lambda r, k: f"{r[k]:.1f} s" if r and r.get(k) is not None else "-"  # noqa: E731
    lines = ["| case | cold: process | cold: first call | warm: process | warm: first call |" + (" run |" if runs else ""),
             "|---|---|---|---|---|" + ("---|" if runs else "")]
    for case in cases:
        cold, warm = by.get((case, "cold")), by.get((case, "warm"))
        run = f" {(cold or warm).get('run', '-')} |" if runs else ""
        lines.append(f"| {case} | {fmt(cold, 'process_s')} | {fmt(cold, 'first_call_s')} | "
                     f"{fmt(warm, 'process_s')} | {fmt(warm, 'first_call_s')} |{run}")
    return "\n".join(lines)


def ahead_table(rows: list[dict]) -> str:
    """The cold first call with compiling ahead on and off (DIYFLASH_COMPILE_AHEAD) beside FlexAttention's, a
    line per round of fresh processes on one machine (the rows' "round" and "compile_ahead"; the dense case's)."""
    by = {(r["round"], r.get("compile_ahead")): r for r in rows
          if r["cache"] == "cold" and r["case"] in ("diyflash-attention", "flex")}
    lines = ["| round | compiling ahead (default) | `DIYFLASH_COMPILE_AHEAD=0` | FlexAttention | ahead / off | ahead / Flex |",
             "|---|---|---|---|---|---|"]
    for rnd in sorted({r for r, _ in by}):
        on, off, flex = (by[(rnd, mode)]["first_call_s"] for mode in (True, False, None))
        lines.append(f"| {rnd} | {on:.1f} s | {off:.1f} s | {flex:.1f} s | {on / off:.2f}x | {on / flex:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
