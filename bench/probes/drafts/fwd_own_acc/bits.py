"""The Hopper forward's outputs and lse on odd causal and non-causal head_dim-128 shapes (the Hopper backend
forced), saved to argv[1]: the fwd_own_acc A/B compares the two forms' files bit for bit."""
import sys

import torch

import diyflash

torch.manual_seed(0)
out = {}
for b, h, hk, n_q, n_k, causal, dtype in [(2, 8, 2, 1000, 1000, True, torch.bfloat16),
                                          (1, 4, 4, 1023, 1023, True, torch.float16),
                                          (2, 4, 1, 700, 1111, True, torch.bfloat16),
                                          (1, 8, 8, 4096, 4096, True, torch.float16),
                                          (1, 4, 4, 1500, 1500, False, torch.bfloat16)]:
    q = torch.randn(b, h, n_q, 128, device="cuda", dtype=dtype)
    k = torch.randn(b, hk, n_k, 128, device="cuda", dtype=dtype)
    v = torch.randn(b, hk, n_k, 128, device="cuda", dtype=dtype)
    o, lse = diyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    out[(b, h, hk, n_q, n_k, causal, str(dtype))] = (o.cpu(), lse.cpu())
torch.save(out, sys.argv[1])
