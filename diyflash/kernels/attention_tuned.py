"""Tuned attention tiles (block_m, block_n, num_warps, num_stages) per kernel, causal or not, and padded
head_dim. Written by `python -m bench.attention_configs --write`; edit by re-running it, not by hand.

Source: NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T00:18:25+00:00.
Command: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 256 --causal both --kinds dq --write
Entries that command did not sweep were kept from the file it replaced.
"""

TUNED = {
    'fwd': {
        'plain': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 4), 128: (128, 64, 8, 3), 256: (128, 32, 8, 3)},
        'causal': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (128, 32, 8, 4)},
    },
    'dkdv': {
        'plain': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (32, 64, 4, 3), 128: (32, 64, 4, 3), 256: (64, 64, 8, 2)},
        'causal': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (32, 64, 4, 2), 128: (64, 128, 8, 3), 256: (64, 64, 8, 2)},
    },
    'dq': {
        'plain': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (128, 32, 8, 3), 128: (128, 64, 8, 3), 256: (128, 32, 8, 2)},
        'causal': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 32, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 4, 3)},
    },
}
