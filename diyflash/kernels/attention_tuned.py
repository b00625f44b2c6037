"""Tuned attention tiles (block_m, block_n, num_warps, num_stages, *flags) per kernel, causal or not,
and padded head_dim. Written by `python -m bench.attention_configs --write`: re-run it rather than edit by hand;
a hand edit adds a line below saying what and why.

Sweeps behind these entries, newest first (an entry comes from the newest sweep that covered it):
- 2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt, run 11): the 4-warp rowoff entries, tuned with 64-bit row offsets and run with 32-bit ones since the ROW32 change, take row64 (64-bit again): fwd causal D128 up to 2048 (N1024 291->299, N2048 359->369 TFLOPS), dkdv plain D64 (whole backward N4096 347->365, N16384 368->374), dq causal D64 (N1024 225->228, N4096 319->322, N16384 352->361)
- 2026-11-22, by hand from bench.attention_configs --n 1024 --head-dims 128 --causal plain --kinds fwd --confirm 6 (no --write; rows in bench/results/attention_configs_h200.jsonl) and bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt, run 10): fwd plain D128 up to 1024 takes 128x64 w8 s3 rowoff (sweep in turns 387->397, probe 388->396 TFLOPS)
- 2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt, runs 8-9), after the kernels' 32-bit row offsets (ROW32; the flag off64 of the lines below is now rowoff): fwd plain D64 takes 128x64 w8 s3 rowoff at every length (in turns against the entries before: N1024 361->366, N2048 387->398, N4096 401->413, N16384 423->428 TFLOPS); dq plain D64 takes 128x64 w8 s3 rowoff (whole backward N4096 341->352, N16384 355->367)
- 2026-11-22, by hand from bench.attention_configs --n 4096 --head-dims 64 --causal plain --kinds fwd --tma none --ws none (no --write) and bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): fwd plain D64 beyond 1024 takes 128x128 w4 s3 off64 (sweep in turns 397->404; probe N2048 377->382, N4096 392->398, N8192 407->410, N16384 414->418 TFLOPS), N<=1024 keeps 128x64 w8 s3 (355 against 351)
- 2026-11-22, by hand from bench.tiles_probe --mode bwd (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): dkdv plain D64 and dq causal D64 keep their 4-warp tiles with off64 addressing (whole backward: plain N4096 349->351, N16384 358->367; causal N1024 216->223, N4096 311->321, N16384 351->351 TFLOPS, in turns)
- 2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): fwd plain D128 up to 1024 takes 64x64 w4 s3 off64 (395->416 TFLOPS at N=1024, in turns; the full benchmark had it 0.96x the tutorial)
- 2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): fwd causal D128 up to 2048 keeps 64x64 w4 s3 with off64 addressing (N=1024 281->295, N=2048 351->374 TFLOPS, in turns)
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T08:35:37+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 256 --causal causal --kinds dv --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T08:34:52+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 256 --causal plain --kinds dv --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T07:42:38+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 256 --causal both --kinds dkdv dq --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T06:37:19+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 64 --causal causal --kinds dkdv dq --write --tma none
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=1024, 2026-11-22T06:26:13+00:00: python -m bench.attention_configs --n 1024 --dtype fp16 --head-dims 64 --causal causal --kinds fwd --write --bucket --tma none
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=1024, 2026-11-22T06:24:53+00:00: python -m bench.attention_configs --n 1024 --dtype fp16 --head-dims 128 --causal plain --kinds fwd --write --bucket
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=2048, 2026-11-22T05:09:09+00:00: python -m bench.attention_configs --n 2048 --dtype fp16 --head-dims 256 --causal causal --kinds dkdv dq --write --bucket
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=2048, 2026-11-22T05:06:18+00:00: python -m bench.attention_configs --n 2048 --dtype fp16 --head-dims 256 --causal plain --kinds dkdv dq --write --bucket
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=2048, 2026-11-22T05:03:29+00:00: python -m bench.attention_configs --n 2048 --dtype fp16 --head-dims 64 128 256 --causal causal --kinds fwd --write --bucket
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T03:44:23+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 256 --causal causal --kinds dkdv dq --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T03:38:44+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 256 --causal plain --kinds dkdv dq --write
- 2026-11-22, by hand from a TMA probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192; the same candidates the sweep now has; bench/results/attention_tma_probe_h200.jsonl): fwd D128/D256, dkdv D128/D256 and dq D256 read their streamed tiles through TMA; fwd D128 128x64 w4 s2 (plain 467->510, causal 437->508 TFLOPS), fwd D256 128x64 w8 s2 (444->515, 401->479), dkdv D256 split s2->s3 (whole backward 240->307, 247->278), dq D256 128x32 w8 s3 (243->277 plain)
- 2026-11-22, by hand after the full benchmark: fwd causal D64/D128 and dkdv/dq causal D128 put back to the tiles they had before the sweeps below; those sweeps' winners measured 1-8 % slower in the full benchmark (bench/results/attention_h200.jsonl, README 'Speed')
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T02:30:09+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 64 128 --causal both --kinds fwd --write
- NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T02:21:04+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 128 --causal both --kinds dkdv dq --write
"""

SWEEPS = [
    '2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt, run 11): the 4-warp rowoff entries, tuned with 64-bit row offsets and run with 32-bit ones since the ROW32 change, take row64 (64-bit again): fwd causal D128 up to 2048 (N1024 291->299, N2048 359->369 TFLOPS), dkdv plain D64 (whole backward N4096 347->365, N16384 368->374), dq causal D64 (N1024 225->228, N4096 319->322, N16384 352->361)',
    '2026-11-22, by hand from bench.attention_configs --n 1024 --head-dims 128 --causal plain --kinds fwd --confirm 6 (no --write; rows in bench/results/attention_configs_h200.jsonl) and bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt, run 10): fwd plain D128 up to 1024 takes 128x64 w8 s3 rowoff (sweep in turns 387->397, probe 388->396 TFLOPS)',
    "2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt, runs 8-9), after the kernels' 32-bit row offsets (ROW32; the flag off64 of the lines below is now rowoff): fwd plain D64 takes 128x64 w8 s3 rowoff at every length (in turns against the entries before: N1024 361->366, N2048 387->398, N4096 401->413, N16384 423->428 TFLOPS); dq plain D64 takes 128x64 w8 s3 rowoff (whole backward N4096 341->352, N16384 355->367)",
    '2026-11-22, by hand from bench.attention_configs --n 4096 --head-dims 64 --causal plain --kinds fwd --tma none --ws none (no --write) and bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): fwd plain D64 beyond 1024 takes 128x128 w4 s3 off64 (sweep in turns 397->404; probe N2048 377->382, N4096 392->398, N8192 407->410, N16384 414->418 TFLOPS), N<=1024 keeps 128x64 w8 s3 (355 against 351)',
    '2026-11-22, by hand from bench.tiles_probe --mode bwd (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): dkdv plain D64 and dq causal D64 keep their 4-warp tiles with off64 addressing (whole backward: plain N4096 349->351, N16384 358->367; causal N1024 216->223, N4096 311->321, N16384 351->351 TFLOPS, in turns)',
    '2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): fwd plain D128 up to 1024 takes 64x64 w4 s3 off64 (395->416 TFLOPS at N=1024, in turns; the full benchmark had it 0.96x the tutorial)',
    '2026-11-22, by hand from bench.tiles_probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16; bench/results/attention_tiles_probe_h200.txt): fwd causal D128 up to 2048 keeps 64x64 w4 s3 with off64 addressing (N=1024 281->295, N=2048 351->374 TFLOPS, in turns)',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T08:35:37+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 256 --causal causal --kinds dv --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T08:34:52+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 256 --causal plain --kinds dv --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T07:42:38+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 256 --causal both --kinds dkdv dq --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=16384, 2026-11-22T06:37:19+00:00: python -m bench.attention_configs --n 16384 --dtype fp16 --head-dims 64 --causal causal --kinds dkdv dq --write --tma none',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=1024, 2026-11-22T06:26:13+00:00: python -m bench.attention_configs --n 1024 --dtype fp16 --head-dims 64 --causal causal --kinds fwd --write --bucket --tma none',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=1024, 2026-11-22T06:24:53+00:00: python -m bench.attention_configs --n 1024 --dtype fp16 --head-dims 128 --causal plain --kinds fwd --write --bucket',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=2048, 2026-11-22T05:09:09+00:00: python -m bench.attention_configs --n 2048 --dtype fp16 --head-dims 256 --causal causal --kinds dkdv dq --write --bucket',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=2048, 2026-11-22T05:06:18+00:00: python -m bench.attention_configs --n 2048 --dtype fp16 --head-dims 256 --causal plain --kinds dkdv dq --write --bucket',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=2048, 2026-11-22T05:03:29+00:00: python -m bench.attention_configs --n 2048 --dtype fp16 --head-dims 64 128 256 --causal causal --kinds fwd --write --bucket',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T03:44:23+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 256 --causal causal --kinds dkdv dq --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T03:38:44+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 256 --causal plain --kinds dkdv dq --write',
    '2026-11-22, by hand from a TMA probe (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192; the same candidates the sweep now has; bench/results/attention_tma_probe_h200.jsonl): fwd D128/D256, dkdv D128/D256 and dq D256 read their streamed tiles through TMA; fwd D128 128x64 w4 s2 (plain 467->510, causal 437->508 TFLOPS), fwd D256 128x64 w8 s2 (444->515, 401->479), dkdv D256 split s2->s3 (whole backward 240->307, 247->278), dq D256 128x32 w8 s3 (243->277 plain)',
    "2026-11-22, by hand after the full benchmark: fwd causal D64/D128 and dkdv/dq causal D128 put back to the tiles they had before the sweeps below; those sweeps' winners measured 1-8 % slower in the full benchmark (bench/results/attention_h200.jsonl, README 'Speed')",
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=8192, 2026-11-22T02:30:09+00:00: python -m bench.attention_configs --n 8192 --dtype fp16 --head-dims 64 128 --causal both --kinds fwd --write',
    'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, fp16, N=4096, 2026-11-22T02:21:04+00:00: python -m bench.attention_configs --n 4096 --dtype fp16 --head-dims 128 --causal both --kinds dkdv dq --write',
]

TUNED = {
    'fwd': {
        'plain': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 3, 'rowoff'), 128: {1024: (128, 64, 8, 3, 'rowoff'), None: (128, 64, 4, 2, 'tma')}, 256: (128, 64, 8, 2, 'tma')},
        'causal': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 3), 128: {2048: (64, 64, 4, 3, 'rowoff', 'row64'), None: (128, 64, 4, 2, 'tma')}, 256: {2048: (64, 64, 4, 3, 'tma'), None: (128, 64, 8, 2, 'tma')}},
    },
    'dkdv': {
        'plain': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (32, 64, 4, 3, 'rowoff', 'row64'), 128: (64, 128, 8, 3, 'tma'), 256: (32, 64, 4, 3, 'split', 'tma')},
        'causal': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 64, 4, 3), 128: (64, 128, 8, 3, 'tma'), 256: (32, 128, 8, 2, 'split', 'tma')},
    },
    'dq': {
        'plain': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (128, 64, 8, 3, 'rowoff'), 128: (128, 64, 8, 4), 256: {2048: (64, 32, 4, 4, 'tma'), None: (64, 64, 4, 2, 'tma')}},
        'causal': {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (128, 64, 4, 3, 'rowoff', 'row64'), 128: (128, 64, 8, 3), 256: {2048: (64, 32, 4, 3, 'tma'), None: (64, 32, 4, 4, 'tma')}},
    },
    'dv': {
        'plain': {256: (32, 128, 8, 4, 'tma')},
        'causal': {256: (32, 128, 8, 4, 'tma')},
    },
}
