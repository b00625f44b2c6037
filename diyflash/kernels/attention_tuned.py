"""Tuned attention tiles (block_m, block_n, num_warps, num_stages, *flags) per kernel, causal or not,
and padded head_dim. Written by `python -m bench.attention_configs --write`: re-run it rather than edit by hand;
a hand edit adds a line below saying what and why.

Sweeps behind these entries, newest first (an entry comes from the newest sweep that covered it):
- 2026-11-22, by hand after the full benchmark: fwd causal D64/D128 and dkdv/dq causal D128 put back to the tiles they had before the sweeps below; those sweeps' winners measured 1-8 % slower in the full benchmark (bench/results/attention_h200.jsonl, README 'Speed')
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T02:30:09+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 64 128 --causal both --kinds fwd --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T02:21:04+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 128 --causal both --kinds dkdv dq --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T02:14:55+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 64 --causal causal --kinds dkdv dq --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T02:09:49+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 256 --causal both --kinds dkdv dq --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T00:18:25+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 256 --causal both --kinds dq --write
"""

SWEEPS = [
    "2026-11-22, by hand after the full benchmark: fwd causal D64/D128 and dkdv/dq causal D128 put back to the tiles they had before the sweeps below; those sweeps' winners measured 1-8 % slower in the full benchmark (bench/results/attention_h200.jsonl, README 'Speed')",
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T02:30:09+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 64 128 --causal both --kinds fwd --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T02:21:04+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 128 --causal both --kinds dkdv dq --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T02:14:55+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 64 --causal causal --kinds dkdv dq --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T02:09:49+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 256 --causal both --kinds dkdv dq --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T00:18:25+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 256 --causal both --kinds dq --write',
]

TUNED = {
    'fwd': {
        'plain': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (128, 32, 8, 3)},
        'causal': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (128, 32, 8, 4)},
    },
    'dkdv': {
        'plain': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (32, 64, 4, 3), 128: (64, 128, 8, 3), 256: (32, 128, 8, 2, 'split')},
        'causal': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 64, 4, 4), 128: (64, 128, 8, 3), 256: (32, 128, 8, 2, 'split')},
    },
    'dq': {
        'plain': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (128, 32, 8, 3), 128: (128, 64, 8, 4), 256: (128, 32, 8, 2)},
        'causal': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (128, 32, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 4, 3)},
    },
}
