# (issue 48) the Hopper backward's DRAM traffic and L2 hit rate on GQA 64/8 D128 causal bf16 B1 N16384 with the split of
# 8d6c002 (two query heads a program), one launch: bash bench/probes/drafts/bwd_split_more/ncu.sh (OUT set)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 100 ncu --profile-from-start off --clock-control none -k regex:hopper_bwd --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum -o $OUT/gqa64 python3 bench/probes/drafts/bwd_split_more/ncu_gqa.py 64 > $OUT/ncu64.log 2>&1
ncu -i $OUT/gqa64.ncu-rep --page details 2>&1 | grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Compute \(SM\)|dram__bytes|lts__t_sector_hit|lts__t_sectors_op|SM Frequency"
