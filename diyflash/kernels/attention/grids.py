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
# Measured (H200, the gqa_split probe, bench/results/gqa_split_h200.txt; D128 bf16, backward TFLOPS):
# B1 H16/4 causal N1024 56 -> 117, N2048 121 -> 245, N4096 225 -> 334 (one wave of 128 programs ended on the
# heaviest key blocks); grids of 256 programs and more (B1 N8192, B2 N4096) gained nothing from a split.
# Calls of less work than SPLIT_MIN_WORK (Z*H*N_q*N_k*D) keep one launch: through autograd the backward costs
# ~200 us of host time a call (bench/results/attention_bwd_host_h200.txt), more than such a grid's GPU time, and
# the split's extra launch and two allocations added ~40 us to it (B1 H16/4 N1024 D128, 2^31: the kernels 190 ->
# 90 us, yet autograd.grad in a loop 195 -> 250-290 us a call; H200). B1 H16 N2048 D128 is 2^33. The Hopper
# backward (one program per 128 keys) splits the same way: B1 H16/4 N4096 bf16 causal 280 -> 470 TFLOPS
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
