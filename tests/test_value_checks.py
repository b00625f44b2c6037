"""The API's value checks without a device sync (kernels/value_checks.py): the device-side predicates say
what the host's checks say, `validate` takes True, False or "sync", the default calls never wait for the
GPU (the GPU suite counts syncs), and a bad value on CUDA stops the program with the check's message."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import diyflash
from diyflash.api import _check_seq_lens
from diyflash.ops.checks import cu_seqlens_error, kvcache_values_error
from helpers import ON_GPU, child_env, make_qkv

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from diyflash.kernels.value_checks import cu_seqlens_ok, kv_page_ok, kv_positions_ok, seq_lens_ok  # noqa: E402


@triton.jit
def _seq_lens_probe(lens_ptr, out_ptr, n, n_k, BLOCK: tl.constexpr):
    b = tl.arange(0, BLOCK)
    lens = tl.load(lens_ptr + b, mask=b < n, other=1)
    tl.store(out_ptr + b, seq_lens_ok(lens, n_k).to(tl.int32), mask=b < n)


@triton.jit
def _cu_probe(cu_ptr, out_ptr, batch, total, max_seqlen, BLOCK: tl.constexpr):
    b = tl.arange(0, BLOCK)
    inside = b < batch
    lo = tl.load(cu_ptr + b, mask=inside, other=0)
    hi = tl.load(cu_ptr + b + 1, mask=inside, other=0)
    ok = cu_seqlens_ok(tl.load(cu_ptr), lo, hi, b == 0, b == batch - 1, total, max_seqlen)
    tl.store(out_ptr + b, ok.to(tl.int32), mask=inside)


@triton.jit
def _kv_probe(lens_ptr, pad_ptr, table_ptr, out_ptr, n_new, capacity, page_size, max_pages, num_pages,
              BLOCK: tl.constexpr):
    b = tl.program_id(0)
    lens = tl.load(lens_ptr + b)
    ok = kv_positions_ok(lens, tl.load(pad_ptr + b), n_new, capacity).to(tl.int32)
    p = tl.arange(0, BLOCK)
    page = tl.load(table_ptr + b * max_pages + p, mask=p < max_pages, other=0)
    pages = kv_page_ok(page, p.to(tl.int64) * page_size, lens.to(tl.int64) + n_new, num_pages) | (p >= max_pages)
    tl.store(out_ptr + b, ok * tl.min(pages.to(tl.int32), axis=0))


def _dev():
    """The probes run on CPU tensors under the interpreter, or on the GPU suite's device."""
    return "cuda" if ON_GPU else "cpu"


def test_seq_lens_predicate_is_the_host_rule():
    n_k = 16
    for values in ([16, 1], [0, 4], [17, 2], [-1, 3], [2**31 - 1, 1], [5]):
        lens = torch.tensor(values, dtype=torch.int32, device=_dev())
        out = torch.empty_like(lens)
        _seq_lens_probe[(1,)](lens, out, len(values), n_k, BLOCK=8)
        try:
            _check_seq_lens(lens.cpu(), len(values), n_k, torch.device("cpu"), "sync")
            host_ok = True
        except ValueError:
            host_ok = False
        assert bool(out.all()) == host_ok, values


CU_CASES = [  # (cu, total, max_seqlen)
    ([0, 5, 9, 20], 20, 11), ([0, 5, 9, 20], 20, 10), ([1, 5, 9, 20], 20, 11), ([0, 5, 3, 20], 20, 17),
    ([0, 5, 9, 19], 20, 11), ([0, 0, 0, 0], 0, 0), ([0, 20], 20, 20), ([0, 21], 20, 21), ([0, 7, 7, 20], 20, 13),
]


@pytest.mark.parametrize("cu, total, max_seqlen", CU_CASES)
def test_cu_seqlens_predicate_is_the_host_rule(cu, total, max_seqlen):
    t = torch.tensor(cu, dtype=torch.int32, device=_dev())
    out = torch.empty(len(cu) - 1, dtype=torch.int32, device=_dev())
    _cu_probe[(1,)](t, out, len(cu) - 1, total, max_seqlen, BLOCK=8)
    assert bool(out.all()) == (cu_seqlens_error(t.cpu(), "cu", total, max_seqlen) is None)


@pytest.mark.parametrize("lens, pad, n_new, table", [
    ([10, 30], [0, 0], 2, [[0, 1], [2, 3]]), ([-1, 30], [0, 0], 2, [[0, 1], [2, 3]]),
    ([10, 31], [0, 0], 2, [[0, 1], [2, 3]]), ([10, 30], [0, 33], 2, [[0, 1], [2, 3]]),
    ([10, 30], [-1, 0], 2, [[0, 1], [2, 3]]), ([10, 30], [12, 32], 2, [[0, 1], [2, 3]]),
    ([10, 30], [0, 0], 2, [[0, 9], [2, 3]]), ([10, 30], [0, 0], 2, [[0, 1], [2, 4]]),
    ([10, 14], [0, 0], 2, [[0, -7], [2, 3]]), ([14, 10], [0, 0], 2, [[0, -7], [2, 3]]),
])
def test_kvcache_predicates_are_the_host_rule(lens, pad, n_new, table):
    """Pages of 16 keys, 2 pages a row (capacity 32), 4 pages in the cache; a bad entry past a row's last
    key is never used and passes (rows 10 + 2 = 12 keys use page 0 only)."""
    i32 = dict(dtype=torch.int32, device=_dev())
    lens_t, pad_t, table_t = torch.tensor(lens, **i32), torch.tensor(pad, **i32), torch.tensor(table, **i32)
    out = torch.empty(len(lens), **i32)
    _kv_probe[(len(lens),)](lens_t, pad_t, table_t, out, n_new, 32, 16, 2, 4, BLOCK=2)
    host = kvcache_values_error(lens_t.cpu(), n_new, 32, table_t.cpu(), 4, pad_t.cpu())
    assert bool(out.all()) == (host is None), host


def test_validate_takes_true_false_or_sync(device):
    q, k, v = make_qkv(2, 2, 8, 8, 16, torch.float16, device)
    lens = torch.tensor([0, 8], dtype=torch.int32, device=device)  # a bad length
    for bad in ("yes", 1, None, "eager"):
        with pytest.raises(TypeError, match="validate must be True, False or 'sync'"):
            diyflash.flash_attention(q, k, v, seq_lens=lens, validate=bad)
    with pytest.raises(ValueError, match=r"got seq_lens\[0\] = 0"):
        diyflash.flash_attention(q, k, v, seq_lens=lens, validate="sync")
    out = diyflash.flash_attention(q, k, v, seq_lens=lens, validate=False)  # unchecked: clamped, row 0 is 0
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    if not ON_GPU:  # a CPU tensor's values cost nothing to read: validate=True checks them on the host
        with pytest.raises(ValueError, match=r"got seq_lens\[0\] = 0"):
            diyflash.flash_attention(q, k, v, seq_lens=lens)


def _calls(device):
    """The default calls of each API with index tensors, valid values."""
    q, k, v = make_qkv(2, 4, 64, 64, 64, torch.float16, device)
    lens32 = torch.tensor([64, 17], dtype=torch.int32, device=device)
    lens_cpu = lens32.cpu()
    tq, tk, tv = (t.transpose(1, 2).reshape(-1, 4, 64)[:100] for t in (q, k, v))
    cu = torch.tensor([0, 60, 100], dtype=torch.int32, device=device)
    qd = q[:, :, :1]
    kc, vc = k.clone(), v.clone()
    cache_lens = torch.tensor([10, 40], dtype=torch.int32, device=device)
    k_new, v_new = k[:, :, :2], v[:, :, :2]
    qg = q.detach().requires_grad_()
    return {
        "seq_lens int32": lambda: diyflash.flash_attention(q, k, v, seq_lens=lens32),
        "seq_lens int64": lambda: diyflash.flash_attention(q, k, v, seq_lens=lens32.long()),
        "seq_lens on the CPU": lambda: diyflash.flash_attention(q, k, v, seq_lens=lens_cpu),
        "seq_lens fwd+bwd": lambda: diyflash.flash_attention(qg, k, v, seq_lens=lens32).sum().backward(),
        "varlen": lambda: diyflash.flash_attention_varlen(tq, tk, tv, cu, cu, 60, 60),
        "kvcache": lambda: diyflash.flash_attention_with_kvcache(qd, kc, vc, cache_lens),
        "kvcache append": lambda: diyflash.flash_attention_with_kvcache(qd, kc, vc, cache_lens, k_new, v_new),
    }


@pytest.mark.skipif(not ON_GPU, reason="device syncs exist on CUDA only")
@pytest.mark.parametrize("name", list(_calls("cpu")))
def test_default_calls_never_sync(name):
    call = _calls("cuda")[name]
    call()  # compiles and plans first (compiling may read device properties)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


_BAD = {
    "seq_lens": ("diyflash.flash_attention(q, q, q, seq_lens=torch.tensor([8, 9], dtype=torch.int32, device='cuda'))",
                 "seq_lens must satisfy 0 < seq_lens[b] <= seq_len_k"),
    "cu_seqlens": ("diyflash.flash_attention_varlen(t, t, t, torch.tensor([0, 9, 16], dtype=torch.int32, "
                   "device='cuda'), torch.tensor([0, 8, 16], dtype=torch.int32, device='cuda'), 8, 8)",
                   "cu_seqlens must start at 0"),
    "cache_seqlens": ("diyflash.flash_attention_with_kvcache(q[:, :, :1], c, c.clone(), "
                      "torch.tensor([3, 8], dtype=torch.int32, device='cuda'), n, n.clone())",
                      "cache_seqlens must be >= 0, cache_seqlens + N_new within the cache's capacity"),
    "block_table": ("diyflash.flash_attention_with_kvcache(q[:, :, :1], p, p, torch.tensor([3, 8], "
                    "dtype=torch.int32, device='cuda'), block_table=torch.tensor([[0], [7]], dtype=torch.int32, "
                    "device='cuda'))", "a block_table entry in use is not a page of the cache"),
}


@pytest.mark.skipif(not ON_GPU, reason="the device-side checks run on CUDA tensors")
@pytest.mark.parametrize("name", list(_BAD))
def test_bad_values_stop_the_program_on_the_device(tmp_path, name):
    """validate=True on CUDA: no sync, and the bad value is still caught: the check's assert stops the
    kernel (its message on stderr) and the next CUDA call raises. In a child process: the assert ends
    the CUDA context of the process it happens in."""
    call, message = _BAD[name]
    script = tmp_path / "bad.py"
    script.write_text(textwrap.dedent(f"""
        import torch, diyflash
        q = torch.randn(2, 2, 8, 16, device="cuda", dtype=torch.float16)
        t = torch.randn(16, 2, 16, device="cuda", dtype=torch.float16)
        p = torch.randn(4, 2, 16, 16, device="cuda", dtype=torch.float16)
        c, n = q.clone(), q[:, :, :1].clone()
        torch.cuda.synchronize()
        try:  # the call's first launches may already meet the failed check
            {call}
            torch.cuda.synchronize()
        except RuntimeError as e:
            print("RAISED", str(e).splitlines()[0], flush=True)
    """))
    env = child_env(TRITON_INTERPRET=None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert "RAISED" in done.stdout and "device-side assert" in done.stdout, done.stdout + done.stderr[-3000:]
    assert message in done.stderr, done.stderr[-3000:]


def test_the_kvcache_check_rides_in_the_decode_launch(device, monkeypatch):
    """validate=True on an eager call checks the KV-cache values inside the decode launch (its CHECK
    branch, which leaves the results' bits as they are): the check kernel is queued only where no decode
    launch runs (nothing to attend: the append alone). On CPU the kernels' entry is called directly (the
    API checks CPU values on the host), the CHECK branch run by the interpreter."""
    from diyflash.kernels import value_checks
    from diyflash.kernels.attention import kvcache

    queued = []
    real = value_checks._KVCACHE

    def spy(*args, **meta):
        queued.append(args[0])
        if ON_GPU:
            real(*args, **meta)

    monkeypatch.setattr(value_checks, "_KVCACHE", spy)
    q, k, v = make_qkv(2, 4, 3, 64, 16, torch.float16, device)
    lens = torch.tensor([10, 40], dtype=torch.int32, device=device)
    table = torch.arange(8, dtype=torch.int32, device=device).view(2, 4)
    pages = k.reshape(8, 4, 16, 16)
    for kc, vc, bt in ((k, v, None), (pages, pages.clone(), table)):
        for n_q in (1, 3):
            runs = [kvcache.attention_kvcache(q[:, :, :n_q], kc, vc, lens, None, None, bt, True, 0.25, check=check)
                    for check in (False, True, True)]
            assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))
    if ON_GPU:
        diyflash.flash_attention_with_kvcache(q[:, :, :1], k, v, lens)
        diyflash.flash_attention_with_kvcache(q[:, :, :1], k, v, lens, q[:, :, :1].clone(), q[:, :, :1].clone())
    assert not queued
    kvcache.attention_kvcache(q[:, :, :0], k, v, lens, q[:, :, :1].clone(), q[:, :, :1].clone(), None, True, 0.25,
                              check=True)
    assert queued == [(2,)]
