"""diyflash.clear_caches() and diyflash.cache_info(): the public view of what the launchers keep between
calls (plans, bound kernels, kept decode buffers, the matmul's tuned choices)."""

import os
import subprocess
import sys

import torch

import diyflash
from helpers import ON_GPU


def _calls(device):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 32, generator=gen).to(device, torch.float16) for _ in range(3))  # dense route
    kc = torch.randn(1, 2, 256, 32, generator=gen).to(device, torch.float16)
    vc = torch.randn(1, 2, 256, 32, generator=gen).to(device, torch.float16)
    lens = torch.tensor([200], dtype=torch.int32, device=device)
    a = torch.randn(64, 32, generator=gen).to(device, torch.float16)
    return (diyflash.flash_attention(q, k, v, True),
            diyflash.flash_attention_with_kvcache(q[:, :, :1], kc, vc, lens, num_splits=2),
            diyflash.triton_matmul(a, a.t()))


def test_clear_caches_forgets_and_the_next_calls_agree(device):
    first = _calls(device)
    info = diyflash.cache_info()
    for kind in ("attention plans", "kv-cache plans", "kept decode buffers", "matmul plans"):
        assert kind in info, info
    if ON_GPU:  # the interpreter keeps no plans (no compiled kernels) and no buffers
        assert info["attention plans"] > 0 and info["kv-cache plans"] > 0 and info["kept decode buffers"] > 0
        assert info["kept decode bytes"] > 0 and info["attention bound kernels"] > 0
    diyflash.clear_caches()
    assert all(v == 0 for v in diyflash.cache_info().values()), diyflash.cache_info()
    again = _calls(device)  # the host path once more: the same kernels, the same bits
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_a_first_attention_call_after_clear_caches_tunes_nothing(device, monkeypatch):
    """Attention's tiles come from its shipped table (kernels/attention_tuned.py) and heuristics, never from timing
    candidates: no attention kernel is a triton.autotune Autotuner, and after clear_caches() a first forward +
    backward and a decode call run with every timer a tuner would use made to raise. (The matmul tunes a shape
    bucket on its first call unless use_autotune=False, as its API says.)"""
    import triton.testing
    from triton.runtime.autotuner import Autotuner

    from diyflash.kernels import matmul
    from diyflash.kernels.attention import kvcache, launch

    kernels = launch._attention_kernels() or [lc.kernel for lc in (*launch._LAUNCHERS, *kvcache.LAUNCHERS)]
    assert len(kernels) >= 9 and not any(isinstance(kernel, Autotuner) for kernel in kernels)

    def refuse(*args, **kwargs):
        raise AssertionError("a first attention call timed candidates")

    for name in ("do_bench", "do_bench_cudagraph"):
        monkeypatch.setattr(triton.testing, name, refuse)
    monkeypatch.setattr(matmul, "_tune", refuse)
    diyflash.clear_caches()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 96, 64, generator=gen).to(device, torch.float16).requires_grad_() for _ in range(3))
    out = diyflash.flash_attention(q, k, v, True)
    out.sum().backward()
    kc, vc = (torch.randn(1, 2, 160, 64, generator=gen).to(device, torch.float16) for _ in range(2))
    lens = torch.tensor([150], dtype=torch.int32, device=device)
    decoded = diyflash.flash_attention_with_kvcache(q.detach()[:, :, :1], kc, vc, lens)
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(decoded).all()


def test_plain_switch_turns_every_shortcut_off(device, tmp_path):
    """DIYFLASH_PLAIN=1: every API call goes through its op, nothing is kept between calls (on the GPU, where
    plans and buffers are kept otherwise), and the results are the same bits as with the shortcuts."""
    from diyflash.ops.eager import dispatcher_free

    assert dispatcher_free(torch.ones(1))  # the shortcut, without the switch
    script = f"""
import torch, diyflash
from diyflash.ops.eager import dispatcher_free
from test_caches import _calls
assert not dispatcher_free(torch.ones(1))  # every API call through its op
results = _calls({str(device)!r})
info = diyflash.cache_info()
info.pop("matmul tuned choices")  # the tuner's choice is not a shortcut: the plain path tunes too
assert all(v == 0 for v in info.values()), info
torch.save([r.cpu() for r in results], {str(tmp_path / "plain.pt")!r})
"""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "DIYFLASH_PLAIN": "1", "PYTHONPATH": os.pathsep.join([here, *sys.path])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    plain = torch.load(tmp_path / "plain.pt")
    for a, b in zip(plain, _calls(device)):
        assert torch.equal(a, b.cpu())


def test_one_eviction_rule_and_one_registry():
    """Every store the launchers keep follows _runtime.remember (a full store starts over, an existing key is
    replaced without clearing) and is counted and cleared through the registry, also after a test rebinds it."""
    from diyflash.kernels import _runtime

    store = {}
    for i in range(3):
        _runtime.remember(store, i, i, limit=3)
    _runtime.remember(store, 2, "again", limit=3)  # a known key: no start-over
    assert store == {0: 0, 1: 1, 2: "again"}
    _runtime.remember(store, 3, 3, limit=3)  # full: starts over
    assert store == {3: 3}

    holder = {"s": {"a": 1}}
    _runtime.keep("test store", lambda: (holder["s"],), ("test measure", lambda stores: 7 * len(list(stores))))
    try:
        assert diyflash.cache_info()["test store"] == 1 and diyflash.cache_info()["test measure"] == 7
        holder["s"] = {"b": 1, "c": 2}  # rebound (as a test's monkeypatch does): the new one is counted
        assert diyflash.cache_info()["test store"] == 2
        diyflash.clear_caches()
        assert holder["s"] == {} and diyflash.cache_info()["test store"] == 0
    finally:
        _runtime._KEPT_KINDS.pop("test store")
