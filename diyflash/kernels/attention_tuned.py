"""Tuned attention tiles (block_m, block_n, num_warps, num_stages, *flags) per kernel, causal or not,
and padded head_dim. Written by `python -m bench.attention_configs --write`: re-run it rather than edit by hand.
Each sweep that wrote it, and each hand edit, is a row of bench/results/attention_tuned_history.jsonl
(device, versions, date, command or reason); an entry comes from the newest row that covered it."""

TUNED = {
    'fwd': {
        'plain': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 3, 'rowoff', 'lazy'), 128: (128, 64, 4, 2, 'tma', 'lazy'), 256: (128, 64, 8, 2, 'tma', 'lazy')},
        'causal': {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 8, 3, 'lazy'), 128: {2048: (64, 64, 4, 3, 'tma', 'lazy'), None: (128, 64, 4, 2, 'tma', 'lazy')}, 256: {2048: (64, 64, 4, 3, 'tma', 'lazy'), None: (128, 64, 8, 2, 'tma', 'lazy')}},
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
