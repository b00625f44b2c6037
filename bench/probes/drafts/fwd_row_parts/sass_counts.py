# offline sm_90a builds (Triton 3.6 first on PYTHONPATH) of tests/test_hopper._COMPILE's forward cases: spills and SASS counts
# (SHFL, FADD, STS, LDS), run on each tree: PYTHONPATH=/tmp/t36:$PWD python sass_counts.py
import json, sys, os, re, subprocess, tempfile
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import tests.test_hopper as th
src = th._COMPILE
src = src[:src.index("print(json.dumps(")]
g = {}
exec(src, g)
import torch, triton
kern = {}
orig = triton.compile
def cap(*a, **k):
    r = orig(*a, **k); kern["k"] = r; return r
g["triton"].compile = cap
cases = [(128, True, False, False, torch.bfloat16, 3), (128, False, False, False, torch.float16, 0),
         (128, True, True, False, torch.bfloat16, 3), (64, False, True, True, torch.float16, 0),
         (64, False, False, False, torch.bfloat16, 3), (64, True, False, False, torch.float16, 0)]
for c in cases:
    r = g["build"](*c)
    k = kern["k"]
    f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(k.asm["cubin"]); f.close()
    out = subprocess.run(["/tmp/t36/triton/backends/nvidia/bin/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    ins = [l for l in out.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", l)]
    cnt = lambda pat: sum(1 for l in ins if re.search(pat, l))
    print(c, "wgmma", r["wgmma"], "shared", r["shared"], "spill", re.findall(r"(\d+) bytes spill stores", r["ptxas"]["text"])[:2],
          "ins", len(ins), "shfl", cnt(r"SHFL"), "fadd", cnt(r"\bFADD"), "sts", cnt(r"\bSTS"), "lds", cnt(r"\bLDS"), flush=True)
