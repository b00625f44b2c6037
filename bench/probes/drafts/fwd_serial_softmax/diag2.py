"""(issue 48) serial.patch's failing bitwise test, taken apart: for each case SERIAL forced off and on
(hopper.Tiles.meta), three calls after clear_caches (the first builds the plan, the others replay it: the C++
Program where it is built, as under pytest), then two more with Programs off (Python's replay). Every result
against the first call with SERIAL off: equal or not, how many elements, the largest difference, which rows
(b, h, row), lse's NaN and inf counts there, and each result's error against the float64 reference. Run on the
GPU machine with the patch applied: DIYFLASH_TEST_DEVICE=cuda PYTHONPATH=$PWD python .../diag2.py"""
import sys
import torch
import diyflash
from diyflash.kernels import _cplan
from diyflash.kernels.attention import hopper
from diyflash.reference import attention_ref

sys.path.insert(0, "tests")
from helpers import make_qkv  # noqa: E402

print("C plans:", _cplan.ready(timeout=600) is not None, _cplan.reason())
meta = hopper.Tiles.meta
hopper.use("hopper")
CASES = [(2, 4, 4, 113, 17, 64, True), (1, 4, 2, 700, 1000, 64, True), (2, 4, 2, 1000, 1000, 128, True)]
for case in CASES:
    b, h, hk, nq, nk, d, causal = case
    q = make_qkv(b, h, nq, nq, d, torch.bfloat16, seed=5)[0]
    k, v = make_qkv(b, hk, nk, nk, d, torch.bfloat16, seed=6)[1:]
    ref = attention_ref(q, k, v, causal=causal)[0]
    res = {}
    for s in (False, True):
        hopper.Tiles.meta = lambda self, n_k, banded, s=s: dict(meta(self, n_k, banded), SERIAL=s)
        diyflash.clear_caches()
        for c in range(3):
            res[(s, "C" if c else "first", c)] = diyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
        _cplan.use(False)
        for c in range(3, 5):
            res[(s, "py", c)] = diyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
        _cplan.use(True)
    torch.cuda.synchronize()
    o0, l0 = res[(False, "first", 0)]
    print("case", case)
    for key, (o, l) in res.items():
        do = (o.float() - o0.float()).abs()
        same_l = (l == l0) | (l.isnan() & l0.isnan())
        rows = ((do > 0).any(-1) | ~same_l).nonzero().tolist()
        err = (o.double() - ref).abs().max().item()
        print(f"  serial={key[0]!s:5} {key[1]:5} #{key[2]}: out ne {int((do > 0).sum())} max {do.max().item():.3g}"
              f" | lse ne {int((~same_l).sum())} nan {int(l.isnan().sum())} -inf {int(l.isneginf().sum())}"
              f" | err {err:.3g} | rows {len(rows)} {rows[:6]}", flush=True)
        if rows:
            z, hh, r = rows[0]
            print(f"      row {rows[0]}: lse {l[z, hh, r].item()!r} vs {l0[z, hh, r].item()!r};"
                  f" out[:4] {o[z, hh, r, :4].tolist()} vs {o0[z, hh, r, :4].tolist()}")
