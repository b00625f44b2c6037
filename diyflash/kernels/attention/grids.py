"""How a kernel's grid is shaped: the head groups causal tiles are dealt over (head_group, tile_order._tile)
and the split of a GQA backward's query-head group over programs (head_split)."""

from __future__ import annotations

import torch

from .._runtime import device_limits

# Tiles a head group of a causal kernel holds, per SM: two, about one wave of resident programs.
# Measured on the H200 (the attention_groups probe, bench/results/attention_groups_h200.jsonl): with
# head groups of 1..128 at D 64/128/256 and N 2048..16384, the fastest group held 128-512 tiles in
# every shape, and ~256 was within noise of the best everywhere. A group of one wave starts its heads'
# heavy tiles together and drains on light ones while the next group starts; larger groups spread
# over more heads than L2 holds, groups that do not divide the heads leave a short group for the end.
GROUP_TILES_PER_SM = 2


def head_group(causal: bool, num_tiles: int, num_bh: int, device: torch.device) -> int:
    """How many heads a kernel's tiles are dealt over at once (_tile): for causal kernels, whose tiles
    differ in work, the most heads that divide the batch's heads evenly and hold at most
    GROUP_TILES_PER_SM tiles (`num_tiles` per head) per SM together; other kernels go head after head."""
    sms = device_limits(device).sms
    if not causal or not sms:
        return 1
    group = max(1, min(num_bh, GROUP_TILES_PER_SM * sms // num_tiles))
    while num_bh % group:
        group -= 1
    return group


# A GQA dk/dv kernel has one program per key block of a kv head, each summing its whole query-head group:
# a grid a group's size smaller than the dense one. Where it holds fewer than SPLIT_PROGRAMS_PER_SM programs
# per SM, the group is split over programs (head_split) and their fp32 partial sums added by one more launch.
# Unsplit, one wave of such programs ends on the heaviest key blocks: the split took B1 H16/4 D128 bf16 causal
# N2048 from 121 to 245 TFLOPS (H200, bench/results/gqa_split_h200.txt); grids of 256 programs and more gained
# nothing. Calls of less work than SPLIT_MIN_WORK (Z*H*N_q*N_k*D; B1 H16 N2048 D128 is 2^33) keep one launch:
# their host time decides, and the split's extra launch and allocations added ~40 us a call through autograd
# (bench/results/attention_bwd_host_h200.txt). The Hopper backward (one program per 128 keys) splits the same way
# (bench/results/onepass_backward_h200.jsonl, run "gqa split").
SPLIT_PROGRAMS_PER_SM = 1
SPLIT_MIN_WORK = 1 << 32


def head_split(kv_group: int, num_programs: int, work: int, device: torch.device,
               max_heads: int | None = None) -> int:
    """Over how many programs the dk/dv kernel splits each kv head's group of kv_group query heads: the
    smallest divisor of kv_group that gives its grid of num_programs (key blocks x kv heads x batch) at
    least SPLIT_PROGRAMS_PER_SM programs per SM and each program at most max_heads query heads, or kv_group
    (one query head a program, the dense grid). 1 without GQA, for calls of less work than SPLIT_MIN_WORK,
    or without a GPU to size the grid to."""
    sms = device_limits(device).sms
    if kv_group == 1 or not sms or work < SPLIT_MIN_WORK:
        return 1
    for split in range(1, kv_group + 1):
        if (kv_group % split == 0 and num_programs * split >= SPLIT_PROGRAMS_PER_SM * sms
                and (max_heads is None or kv_group // split <= max_heads)):
            return split
    return kv_group
