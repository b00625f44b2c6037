"""(issue 48) serial.patch's question: the forward with SERIAL forced off and on (hopper.Tiles.meta) on three
head-dim-64 causal shapes, bf16 and fp16: whether out and lse agree bit for bit, how far apart, each one's error
against the float64 reference, and whether SERIAL off gives the same bits twice. Run on the GPU machine with the
patch applied: DIYFLASH_TEST_DEVICE=cuda PYTHONPATH=$PWD python bench/probes/drafts/fwd_serial_softmax/diag.py"""
import sys, torch, diyflash
sys.path.insert(0, "tests")
from helpers import make_qkv
from diyflash.reference import attention_ref
from diyflash.kernels.attention import hopper
meta = hopper.Tiles.meta
hopper.use("hopper")
for case in [(2, 4, 4, 113, 17, 64, True), (1, 4, 2, 700, 1000, 64, True), (2, 2, 2, 4096, 4096, 64, True)]:
    b, h, hk, nq, nk, d, causal = case
    for dt in (torch.bfloat16, torch.float16):
        q = make_qkv(b, h, nq, nq, d, dt, seed=5)[0]
        k, v = make_qkv(b, hk, nk, nk, d, dt, seed=6)[1:]
        runs = []
        for s in (False, True, False):
            hopper.Tiles.meta = lambda self, n_k, banded, s=s: dict(meta(self, n_k, banded), SERIAL=s)
            diyflash.clear_caches()
            runs.append(diyflash.flash_attention(q, k, v, causal=causal, return_lse=True))
        (o0, l0), (o1, l1), (o2, l2) = runs
        do = (o0.float() - o1.float()).abs(); dl = (l0 - l1).abs().nan_to_num()
        ref, lref = attention_ref(q, k, v, causal=causal)[:2]
        e0 = (o0.double() - ref).abs().max().item(); e1 = (o1.double() - ref).abs().max().item()
        idx = (do > 0).nonzero()[:3].tolist(); il = (dl > 0).nonzero()[:3].tolist()
        print(case, str(dt)[6:], "repeat equal", torch.equal(o0, o2) and torch.equal(l0, l2), "| out ne", int((do > 0).sum()), "of", do.numel(), "max", do.max().item(),
              "| lse ne", int((dl > 0).sum()), "max", dl.max().item(), "| err base/serial %.3g %.3g" % (e0, e1), "first", idx, il, flush=True)
