"""diyflash.clear_caches() and diyflash.cache_info(): the public view of what the launchers keep between
calls (plans, bound kernels, kept decode buffers, the matmul's tuned choices)."""

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
